"""Trial runs (a Backfill extension, docs/workflow.md): a batch created with `trial` runs a sample of its lines
first, spread across its file; then it reports and pauses itself, or goes on by itself when the trial's success
rate is met (`continue: "auto"`).

The trial's lines are ordinary queue rows marked `trial` (storage/queue/trial_rows.py): while the batch's
`trial_status` is `in_progress` the claim takes only those (storage/queue/claim_order.py), and once every one has
ended the transaction that recorded the last one writes the report and pauses the batch through
storage/batches/control.py, the one place that pauses. A trial line ends once, like any line, and the rest of
the batch runs only its other lines: the trial's are never run twice.
"""

from __future__ import annotations

import math
from collections.abc import Collection
from decimal import Decimal
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from storage import lifecycle
from storage.batches.control import pause_batch
from storage.batches.trial_reports import decide, line_result, trial_report
from storage.errors import InvalidValue
from storage.finance.prices import price_book, price_job
from storage.models import Batch
from storage.protocols import protocol_of
from storage.queue.claim_bands import TRIAL_RUNNING
from storage.queue.trial_rows import mark_trial_rows, open_rows, stated_tokens, trial_results
from storage.settings import Settings

RUNNING = TRIAL_RUNNING  # its home: storage/queue/claim_bands.py (the claim reads it)
REPORTED = "reported"
MAX_SHARE = 0.5  # a trial is a sample: at most half the batch
_KEYS = frozenset({"lines", "share", "continue", "min_success_rate"})


def trial_spec(raw: Any, *, max_lines: int) -> dict[str, Any]:
    """The trial a create asked for, checked and with its defaults: exactly one of `lines` (1..max_lines) or
    `share` (more than 0, at most 0.5); `continue` "manual" (default) or "auto"; `min_success_rate` 0..1 (0.95)."""
    if not isinstance(raw, dict):
        raise InvalidValue('trial must be an object, e.g. {"lines": 50}.', param="trial")
    if unknown := sorted(set(raw) - _KEYS):
        raise InvalidValue(
            f"Unknown trial field '{unknown[0][:64]}'; known: {', '.join(sorted(_KEYS))}.", param="trial"
        )
    if ("lines" in raw) == ("share" in raw):
        raise InvalidValue("trial takes exactly one of 'lines' or 'share'.", param="trial")
    spec: dict[str, Any] = {}
    if "lines" in raw:
        lines = raw["lines"]
        if not isinstance(lines, int) or isinstance(lines, bool) or not 1 <= lines <= max_lines:
            raise InvalidValue(f"trial.lines must be an integer from 1 to {max_lines}.", param="trial.lines")
        spec["lines"] = lines
    else:
        spec["share"] = _fraction(raw["share"], param="trial.share", low_open=True, high=MAX_SHARE)
    mode = raw.get("continue", "manual")
    if mode not in ("auto", "manual"):
        raise InvalidValue("trial.continue must be 'auto' or 'manual'.", param="trial.continue")
    spec["continue"] = mode
    spec["min_success_rate"] = _fraction(raw.get("min_success_rate", 0.95), param="trial.min_success_rate")
    return spec


def _fraction(value: Any, *, param: str, low_open: bool = False, high: float = 1.0) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or (isinstance(value, float) and not math.isfinite(value))
    ):
        raise InvalidValue(f"{param} must be a number.", param=param)
    if value < 0 or (low_open and value == 0) or value > high:
        low = "more than 0" if low_open else "at least 0"
        raise InvalidValue(f"{param} must be {low} and at most {high}.", param=param)
    return float(value)


def trial_size(spec: dict[str, Any], *, total: int) -> int:
    """How many lines the trial of a `total`-line batch runs (at least 1, at most the batch)."""
    wanted = spec["lines"] if "lines" in spec else math.ceil(spec["share"] * total)
    return max(1, min(int(wanted), total))


def sample_positions(total: int, count: int) -> list[int]:
    """`count` distinct 0-based positions spread evenly over `total` lines (the middle of each of `count` equal
    stretches): deterministic, the whole file covered, never only its head."""
    count = max(0, min(count, total))
    return [(2 * index + 1) * total // (2 * count) for index in range(count)]


def start_trial(session: Session, settings: Settings, *, batch: Batch) -> None:
    """Once a batch with a trial is queued: mark its trial lines and let the claim take only those."""
    if batch.trial is None or batch.trial_status is not None:
        return
    total = batch.request_total
    mark_trial_rows(session, batch_id=batch.id, positions=sample_positions(total, trial_size(batch.trial, total=total)))
    batch.trial_status = RUNNING
    session.flush()
    settle_trials(session, settings, batch_ids=[batch.id])  # lines ended at ingest (an unserved model) count


def settle_trials(session: Session, settings: Settings, *, batch_ids: Collection[str] | None) -> list[str]:
    """Report every trial among these batches (None: every running trial, the reaper's pass) whose lines have all
    ended, and pause or continue its batch (in the caller's transaction, the one that recorded the last line);
    return the batches concluded."""
    if batch_ids is not None and not batch_ids:
        return []
    query = select(Batch).where(Batch.trial_status == RUNNING).order_by(Batch.id)
    if batch_ids is not None:
        query = query.where(Batch.id.in_(sorted(batch_ids)))
    running = list(session.scalars(query))
    if not running:
        return []
    still_open = open_rows(session, batch_ids=[batch.id for batch in running], trial_only=True)
    concluded = [batch for batch in running if not still_open.get(batch.id)]
    for batch in concluded:
        _conclude(session, settings, batch=batch)
    return [batch.id for batch in concluded]


def _conclude(session: Session, settings: Settings, *, batch: Batch) -> None:
    spec = dict(batch.trial or {})
    spec.pop("report", None)
    book, checked = price_book(settings), batch.checks is not None

    def cost(model: str, tokens_in: int, tokens_out: int, cached: int = 0) -> Decimal:
        return price_job(
            book, model=model, created_at=batch.created_at, completion_window=batch.completion_window,
            input_tokens=tokens_in, output_tokens=tokens_out, busy_seconds=Decimal(0), cached_input_tokens=cached,
        ).billed_usd  # fmt: skip

    rows = trial_results(session, batch_id=batch.id)
    lines = [
        line_result(
            status=row.status,
            error_code=row.error_code,
            response_status=row.response_status,
            input_tokens=row.prompt_tokens,
            output_tokens=row.completion_tokens,
            cost_usd=cost(row.model, row.prompt_tokens, row.completion_tokens, row.cached_tokens)
            if row.status == lifecycle.REQ_COMPLETED
            else Decimal(0),
            check_attempts=row.check_attempts,
            checked=checked,
        )
        for row in rows
    ]
    # What every line states up front (its prompt's estimated tokens, its output budget), priced: the projection's
    # ratio (lines that state more cost more), so a few long lines the trial missed still count.
    stated = (
        [cost(row.model, row.stated_input, row.stated_output) for row in rows],
        sum((cost(m, i, o) for m, i, o in stated_tokens(session, batch_id=batch.id)), Decimal(0)),
    )
    report = trial_report(lines, total_lines=batch.request_total, stated=stated)
    left = open_rows(session, batch_ids=[batch.id], trial_only=False).get(batch.id, 0)
    # A batch cancelled or expired during its trial (its lines closed, the reaper's pass settles it) only reports.
    ended = batch.status not in lifecycle.CONTROLLABLE
    report["decision"] = "ended" if ended else decide(report, spec=spec, lines_left=left)
    batch.trial, batch.trial_status = {**spec, "report": report}, REPORTED
    session.flush()
    if report["decision"] == "paused":
        pause_batch(session, tenant_id=batch.tenant_id, batch_id=batch.id, protocol=protocol_of(batch))


def trial_json(batch: Batch) -> dict[str, Any] | None:
    """The `trial` block of a batch object: the spec, `status` and, once run, the report."""
    if batch.trial is None:
        return None
    return {**batch.trial, "status": batch.trial_status or "pending", "report": batch.trial.get("report")}
