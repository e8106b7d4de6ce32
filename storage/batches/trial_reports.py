"""A trial's report (pure arithmetic over its ended lines): success by error code, checks, tokens per line, and
the whole batch's cost projected from the trial with an interval.

The projection. The trial's billed cost is known exactly; the rest of the batch is projected from what every
line states up front (its prompt's estimated tokens and output budget, priced): a **regression estimator**
(Cochran, Sampling Techniques, ch. 7) fits the trial lines' cost to what they state, `cost = a + b x stated`, and
charges the rest its mean stated cost through that line. It replaced a ratio through zero (`cost = b x stated`),
which mis-charged any part of a line's cost that does not scale with what it states (a chat template the prompt
estimate misses) and leaned low on files whose long lines the trial under-samples; the regression is exact when
cost is any straight line in the stated, the ratio only when it is a proportion. With nothing stated (or fewer
than 3 lines, or all stating the same) the rest is projected at the trial's mean per line.

The 95% interval, from what the fit leaves unexplained (the residuals `e`): half-width `q x N x s_e x sqrt((1 -
n/N) / n)`, the total of a sample of `n` of `N` lines without replacement (the finite-population correction:
a trial of half the file is worth more than one of 1%). `q` is Student's t 0.975 quantile, not the normal's 1.96,
at `n - 2` degrees of freedom (`n - 1` for the mean), **fewer when the residuals' tails are heavy**: a spread
estimated from `n` values of kurtosis `k` varies like a chi-square with `2n / (k - 1)` degrees of freedom (`n` at
the normal's 3; `spread_df`). Per-line cost is heavy-tailed (a few long lines cost 10-50 times the median; the
residuals of the fake engine's skewed files have kurtosis 16-25), so 50 trial lines usually understate the
spread: at 50 lines such a file's `q` is about 2.1 instead of 1.96, wider where the trial itself shows heavy tails.

Measured (bench/trial_projection.py on the fake engine, 5,000-line files of three shapes, a 50-line trial, 20
files each; docs/workflow.md): the ratio with 1.96 held the actual cost in 54 of 60 intervals (0.90; 0.80 on
files whose lines grow towards the end, errors up to 7.4%); this projection in 57 of 60 (0.95), errors at most
1.1%, half-widths a fifth as wide; chosen on those, it then held 28 of 30 fresh files run end to end. Rejected
on the same 60: the normal quantile (0.92), Student's t alone (0.92), and t with a one-term Edgeworth shift for
the residuals' skew (Hall 1992; 0.90: the skewness of 50 heavy-tailed residuals is too noisy to move the ends
by); a bootstrap of the residuals would resample only the
tail the trial saw, costs thousands of Decimal resamples in the transaction that records the trial's last line,
and could not be re-derived from the report by hand.

The trial's lines are spread evenly over the file (a systematic sample), which this treats as random: honest
unless the file's cost cycles with the sampling step. The low end is never below what the trial already cost.
Money is Decimal throughout and shown as 6-place strings.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from storage import lifecycle

Z_95 = Decimal("1.96")
_T_TABLE = tuple(  # Student's t 0.975 quantiles, df 1..10
    Decimal(t) for t in ("12.706", "4.303", "3.182", "2.776", "2.571", "2.447", "2.365", "2.306", "2.262", "2.228")
)
_MICRO = Decimal("0.000001")


@dataclass(frozen=True)
class LineResult:
    """An ended trial line: whether it succeeded (else its error code), its tokens, its billed cost, its checks."""

    ok: bool
    error_code: str | None
    input_tokens: int
    output_tokens: int
    cost_usd: Decimal
    attempts: int = 1  # answers drawn (checks: more than one when a check failed)
    checked: bool = False  # its batch has checks
    checks_passed: bool = False


def line_result(
    *, status: str, error_code: str | None, response_status: int | None, input_tokens: int, output_tokens: int,
    cost_usd: Decimal, check_attempts: dict[str, Any] | None, checked: bool,
) -> LineResult:  # fmt: skip
    """A trial row as the report reads it: an ended line without a code is named by its HTTP status."""
    ok = status == lifecycle.REQ_COMPLETED
    code = None if ok else (error_code or (f"http_{response_status}" if response_status else status))
    attempts = int((check_attempts or {}).get("count", 1))
    return LineResult(ok, code, input_tokens, output_tokens, cost_usd, attempts, checked, checked and ok)


def _usd(value: Decimal) -> str:
    return str(value.quantize(_MICRO))


def _mean(values: Sequence[Decimal]) -> Decimal:
    return sum(values, Decimal(0)) / len(values) if values else Decimal(0)


def t_quantile(df: Decimal) -> Decimal:
    """Student's t 0.975 quantile at `df` degrees of freedom (at least 1; a fraction is fine): the table to 10,
    linear between its entries, then Cornish-Fisher in 1/df (within 0.001 of the exact value from 10); the
    normal's 1.96 as df grows."""
    df = max(df, Decimal(1))
    if df < len(_T_TABLE):
        low = int(df)
        return _T_TABLE[low - 1] + (df - low) * (_T_TABLE[low] - _T_TABLE[low - 1])
    z = Z_95
    return (
        z
        + (z**3 + z) / (4 * df)
        + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)
        + (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / (384 * df**3)
    )


def spread_df(residuals: Sequence[Decimal], df: int) -> Decimal:
    """The degrees of freedom the residuals' spread is worth: `df`, or fewer when their tails are heavy. A
    variance estimated from `n` values of kurtosis `k` has relative variance about `(k - 1) / n`, that of a
    chi-square with `2n / (k - 1)` degrees of freedom (`n` at the normal's 3)."""
    n = len(residuals)
    m2 = sum((e * e for e in residuals), Decimal(0)) / n
    if m2 == 0:
        return Decimal(df)
    kurtosis = sum((e**4 for e in residuals), Decimal(0)) / n / (m2 * m2)
    return min(Decimal(df), 2 * n / max(kurtosis - 1, Decimal(2)))


def _fit(
    costs: Sequence[Decimal], stated: tuple[Sequence[Decimal], Decimal] | None, *, total_lines: int
) -> tuple[Decimal, list[Decimal], int]:
    """(the rest's projected cost, the trial lines' residuals, the degrees of freedom of their spread)."""
    n = len(costs)
    rest, mean = max(total_lines - n, 0), _mean(costs)
    xs = list(stated[0]) if stated is not None else []
    x_mean = _mean(xs)
    sxx = sum(((x - x_mean) ** 2 for x in xs), Decimal(0))
    if stated is None or n < 3 or sxx == 0 or rest == 0:  # the mean per line (with nothing stated, or no slope)
        return rest * mean, [cost - mean for cost in costs], n - 1
    slope = sum(((x - x_mean) * (y - mean) for x, y in zip(xs, costs, strict=True)), Decimal(0)) / sxx
    rest_mean = (stated[1] - sum(xs, Decimal(0))) / rest  # what the rest's lines state, on average
    residuals = [y - mean - slope * (x - x_mean) for x, y in zip(xs, costs, strict=True)]
    return rest * (mean + slope * (rest_mean - x_mean)), residuals, n - 2


def projected_cost(
    costs: Sequence[Decimal], *, total_lines: int, stated: tuple[Sequence[Decimal], Decimal] | None = None
) -> dict[str, Any]:
    """The whole batch's cost from its trial lines' costs: the trial's own plus the rest, and a 95% interval (low
    never below what the trial already cost). With `stated` (each trial line's cost at what it states up front,
    and the whole batch's), the rest is projected by regression on what its lines state (the module docstring);
    else at the trial's mean per line."""
    n, spent = len(costs), sum(costs, Decimal(0))
    rest_cost, residuals, df = _fit(costs, stated, total_lines=total_lines)
    estimate = spent + max(rest_cost, Decimal(0))
    below = above = Decimal(0)
    if n >= 2 and total_lines > n and df >= 1:
        spread = (sum((e * e for e in residuals), Decimal(0)) / df).sqrt()
        base = total_lines * spread * ((1 - Decimal(n) / total_lines) / n).sqrt()
        below = above = t_quantile(spread_df(residuals, df)) * base
    return {
        "estimate_usd": _usd(estimate),
        "low_usd": _usd(max(estimate - below, spent)),
        "high_usd": _usd(estimate + above),
        "confidence": 0.95,
        "trial_usd": _usd(spent),
        "lines": total_lines,
    }


def _checks(lines: Sequence[LineResult]) -> dict[str, int] | None:
    checked = [line for line in lines if line.checked]
    if not checked:
        return None
    return {
        "passed": sum(1 for line in checked if line.checks_passed),
        "passed_first_time": sum(1 for line in checked if line.checks_passed and line.attempts == 1),
        "redrawn": sum(1 for line in checked if line.attempts > 1),
        "failed": sum(1 for line in checked if line.error_code == "checks_failed"),
    }


def trial_report(
    lines: Sequence[LineResult], *, total_lines: int, stated: tuple[Sequence[Decimal], Decimal] | None = None
) -> dict[str, Any]:
    """The report of a trial whose lines all ended (no decision yet: `decide` adds it); `stated` as
    `projected_cost` takes it."""
    run, ok = len(lines), [line for line in lines if line.ok]
    errors = Counter(line.error_code or "unknown" for line in lines if not line.ok)
    return {
        "lines_run": run,
        "succeeded": len(ok),
        "success_rate": round(len(ok) / run, 4) if run else 0.0,
        "errors": dict(sorted(errors.items())),
        "checks": _checks(lines),
        "tokens_per_line": {
            "input": round(sum(line.input_tokens for line in ok) / len(ok), 1) if ok else 0.0,
            "output": round(sum(line.output_tokens for line in ok) / len(ok), 1) if ok else 0.0,
        },
        "projected_cost": projected_cost([line.cost_usd for line in lines], total_lines=total_lines, stated=stated),
    }


def decide(report: dict[str, Any], *, spec: dict[str, Any], lines_left: int) -> str:
    """What the batch does after its trial: `completed` (nothing left to run), `continued` (auto, rate met) or
    `paused` (manual, or the rate missed)."""
    if lines_left == 0:
        return "completed"
    if spec.get("continue") == "auto" and report["success_rate"] >= spec["min_success_rate"]:
        return "continued"
    return "paused"


CostOf = Callable[[str, int, int, int], Decimal]  # (model, input, output, cached) -> billed USD
