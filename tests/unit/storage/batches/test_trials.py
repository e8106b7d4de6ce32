"""Trial specs, the trial's sample across the file, and its report's arithmetic (storage/batches/trials.py,
trial_reports.py)."""

from __future__ import annotations

import math
from decimal import Decimal

import pytest

from storage.batches.trial_reports import (
    LineResult,
    decide,
    line_result,
    projected_cost,
    spread_df,
    t_quantile,
    trial_report,
)
from storage.batches.trials import sample_positions, trial_size, trial_spec
from storage.errors import InvalidValue


def test_the_sample_is_spread_over_the_whole_file_distinct_and_the_same_every_time() -> None:
    positions = sample_positions(1000, 10)
    assert positions == [50, 150, 250, 350, 450, 550, 650, 750, 850, 950]
    assert sample_positions(1000, 10) == positions
    assert sample_positions(20, 4) == [2, 7, 12, 17]


@pytest.mark.parametrize(("total", "count"), [(1, 1), (7, 3), (10, 10), (101, 50), (5000, 50), (3, 7)])
def test_sampled_positions_are_in_range_distinct_and_reach_the_last_stretch(total: int, count: int) -> None:
    positions = sample_positions(total, count)
    assert len(positions) == min(total, count) == len(set(positions))
    assert all(0 <= p < total for p in positions) and positions == sorted(positions)
    assert positions[-1] >= total - math.ceil(total / min(total, count))  # never only the head


def test_a_trial_size_comes_from_lines_or_a_share_and_stays_within_the_batch() -> None:
    assert trial_size({"lines": 50}, total=5000) == 50
    assert trial_size({"lines": 50}, total=20) == 20
    assert trial_size({"share": 0.01}, total=5000) == 50
    assert trial_size({"share": 0.01}, total=10) == 1  # at least one line


def test_a_trial_spec_takes_its_defaults_and_refuses_what_is_out_of_bounds() -> None:
    assert trial_spec({"lines": 5}, max_lines=100) == {"lines": 5, "continue": "manual", "min_success_rate": 0.95}
    assert (
        trial_spec({"share": 0.5, "continue": "auto", "min_success_rate": 1}, max_lines=100)["min_success_rate"] == 1.0
    )
    for bad, param in [
        ({"lines": 101}, "trial.lines"),
        ({"lines": True}, "trial.lines"),
        ({"share": 0}, "trial.share"),
        ({"share": float("nan")}, "trial.share"),
        ({"share": "0.1"}, "trial.share"),
        ({}, "trial"),
        ({"lines": 1, "min_success_rate": -0.1}, "trial.min_success_rate"),
        ([1], "trial"),
    ]:
        with pytest.raises(InvalidValue) as refused:
            trial_spec(bad, max_lines=100)
        assert refused.value.param == param, bad


def _line(ok: bool, cost: str, *, code: str | None = None, attempts: int = 1, checked: bool = False) -> LineResult:
    return LineResult(ok, code, 10, 20 if ok else 0, Decimal(cost), attempts, checked, checked and ok)


def test_the_projection_adds_the_rest_at_the_trial_mean_with_a_finite_population_t_interval() -> None:
    costs = [Decimal("0.001"), Decimal("0.002"), Decimal("0.003"), Decimal("0.002")]
    projected = projected_cost(costs, total_lines=100)
    # mean 0.002, sample sd sqrt(0.000002/3), no skew; half-width t(3) * 100 * sd * sqrt((1 - 4/100) / 4)
    sd = (Decimal("0.000002") / 3).sqrt()
    half = Decimal("3.182") * 100 * sd * (Decimal("0.96") / 4).sqrt()
    assert Decimal(projected["estimate_usd"]) == Decimal("0.200000")
    assert Decimal(projected["high_usd"]) == (Decimal("0.2") + half).quantize(Decimal("0.000001"))
    assert Decimal(projected["low_usd"]) == (Decimal("0.2") - half).quantize(Decimal("0.000001"))
    assert projected["trial_usd"] == "0.008000" and projected["lines"] == 100


def test_a_trial_of_the_whole_batch_projects_exactly_what_it_cost() -> None:
    projected = projected_cost([Decimal("0.1"), Decimal("0.3")], total_lines=2)
    assert projected["estimate_usd"] == projected["low_usd"] == projected["high_usd"] == "0.400000"


def test_the_low_end_never_falls_below_what_the_trial_already_cost() -> None:
    projected = projected_cost([Decimal("0"), Decimal("0"), Decimal("1")], total_lines=4)
    assert Decimal(projected["low_usd"]) >= Decimal("1")


def test_a_report_counts_successes_error_codes_checks_and_tokens_of_successful_lines() -> None:
    lines = [
        _line(True, "0.01", checked=True),
        _line(True, "0.01", attempts=3, checked=True),
        _line(False, "0", code="checks_failed", attempts=3, checked=True),
        _line(False, "0", code="invalid_value", checked=True),
    ]
    report = trial_report(lines, total_lines=40)
    assert report["lines_run"] == 4 and report["succeeded"] == 2 and report["success_rate"] == 0.5
    assert report["errors"] == {"checks_failed": 1, "invalid_value": 1}
    assert report["checks"] == {"passed": 2, "passed_first_time": 1, "redrawn": 2, "failed": 1}
    assert report["tokens_per_line"] == {"input": 10.0, "output": 20.0}


def test_a_line_without_an_error_code_is_named_by_its_http_status() -> None:
    line = line_result(
        status="failed", error_code=None, response_status=500, input_tokens=1, output_tokens=0,
        cost_usd=Decimal(0), check_attempts=None, checked=False,
    )  # fmt: skip
    assert line.error_code == "http_500" and trial_report([line], total_lines=1)["checks"] is None


def test_the_decision_follows_continue_and_the_rate() -> None:
    auto = {"continue": "auto", "min_success_rate": 0.9}
    assert decide({"success_rate": 0.9}, spec=auto, lines_left=5) == "continued"
    assert decide({"success_rate": 0.89}, spec=auto, lines_left=5) == "paused"
    assert decide({"success_rate": 1.0}, spec={**auto, "continue": "manual"}, lines_left=5) == "paused"
    assert decide({"success_rate": 0.0}, spec=auto, lines_left=0) == "completed"


def test_a_huge_integer_share_is_refused_not_a_crash() -> None:
    with pytest.raises(InvalidValue):
        trial_spec({"share": 10**400}, max_lines=100)


def test_a_projection_follows_what_the_lines_state_and_is_exact_when_cost_follows_it() -> None:
    # The trial's lines cost twice what they state; the whole file states $20 (long lines the trial missed).
    costs, stated = [Decimal("0.2"), Decimal("0.4"), Decimal("0.6")], [Decimal("0.1"), Decimal("0.2"), Decimal("0.3")]
    projected = projected_cost(costs, total_lines=50, stated=(stated, Decimal("20")))
    assert projected["estimate_usd"] == "40.000000" == projected["low_usd"] == projected["high_usd"]
    per_line = projected_cost(costs, total_lines=50)  # the mean per line knows nothing of the long lines
    assert per_line["estimate_usd"] == "20.000000"


def test_a_projection_widens_with_what_the_stated_cost_leaves_unexplained() -> None:
    costs, stated = [Decimal("0.2"), Decimal("0.5"), Decimal("0.6")], [Decimal("0.1"), Decimal("0.2"), Decimal("0.3")]
    projected = projected_cost(costs, total_lines=50, stated=(stated, Decimal("10")))
    low, mid, high = (Decimal(projected[key]) for key in ("low_usd", "estimate_usd", "high_usd"))
    assert low < mid < high and mid == (Decimal("1.3") + Decimal("1.3") / Decimal("0.6") * Decimal("9.4")).quantize(
        Decimal("0.000001")
    )


def test_a_projection_with_nothing_stated_falls_back_to_the_mean_per_line() -> None:
    costs = [Decimal("1"), Decimal("3")]
    assert projected_cost(costs, total_lines=4, stated=([Decimal(0), Decimal(0)], Decimal(0))) == projected_cost(
        costs, total_lines=4
    )


def test_a_cost_that_is_a_fixed_part_plus_a_multiple_of_the_stated_is_projected_exactly() -> None:
    # Each line costs $0.05 (say, a template the estimate misses) plus twice what it states; a ratio through zero
    # would charge the fixed part in proportion to the stated and miss; the regression does not.
    stated = [Decimal("0.1"), Decimal("0.2"), Decimal("0.3"), Decimal("0.4")]
    costs = [Decimal("0.05") + 2 * x for x in stated]
    projected = projected_cost(costs, total_lines=50, stated=(stated, Decimal("20")))
    # the trial's $2.20 + 46 lines x $0.05 + 2 x the rest's stated $19
    assert projected["estimate_usd"] == "42.500000" == projected["low_usd"] == projected["high_usd"]


def test_heavy_tailed_costs_widen_the_interval_beyond_students_t() -> None:
    # 18 short lines and two 9-12x longer: the trial's spread is itself uncertain, so it counts for fewer degrees
    # of freedom than 19 (kurtosis 8.3: 2 x 20 / 7.3 = 5.5), and the t quantile grows from 2.093 to about 2.52.
    costs = [Decimal("1")] * 18 + [Decimal("9"), Decimal("12")]
    mean = sum(costs, Decimal(0)) / 20
    residuals = [cost - mean for cost in costs]
    assert spread_df(residuals, 19) < Decimal("5.6")
    projected = projected_cost(costs, total_lines=1000)
    sd = (sum((e * e for e in residuals), Decimal(0)) / 19).sqrt()
    base = 1000 * sd * ((1 - Decimal(20) / 1000) / 20).sqrt()
    half = Decimal(projected["high_usd"]) - Decimal(projected["estimate_usd"])
    assert abs(half - t_quantile(spread_df(residuals, 19)) * base) < Decimal("0.000002")
    assert half > Decimal("2.5") * base
    assert t_quantile(Decimal(19)).quantize(Decimal("0.01")) == Decimal("2.09")  # Student's, light tails
