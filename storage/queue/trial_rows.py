"""A batch's trial lines (storage/batches/trials.py): marking them, what is still open, what they came to."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from sqlalchemy import func, select, true, update
from sqlalchemy.orm import Session

from storage import lifecycle
from storage.models import BatchRequest


@dataclass(frozen=True)
class TrialRow:
    """One ended trial line, as its report reads it."""

    model: str
    status: str
    error_code: str | None
    response_status: int | None
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    check_attempts: dict[str, Any] | None
    stated_input: int = 0  # what the line states up front: its prompt's estimated tokens and its output budget
    stated_output: int = 0


def mark_trial_rows(session: Session, *, batch_id: str, positions: Collection[int]) -> int:
    """Mark the batch's lines at these 0-based positions (in line order) as trial lines; return how many."""
    if not positions:
        return 0
    ranked = (
        select(BatchRequest.id, (func.row_number().over(order_by=BatchRequest.line) - 1).label("pos"))
        .where(BatchRequest.batch_id == batch_id)
        .subquery()
    )
    chosen = select(ranked.c.id).where(ranked.c.pos.in_(sorted(positions)))
    marked = session.execute(
        update(BatchRequest)
        .where(BatchRequest.batch_id == batch_id, BatchRequest.id.in_(chosen))
        .values(trial=True)
        .execution_options(synchronize_session=False)
    )
    return int(marked.rowcount or 0)  # type: ignore[attr-defined]


def open_rows(session: Session, *, batch_ids: Collection[str], trial_only: bool) -> dict[str, int]:
    """How many rows of each batch are still queued or running (only its trial lines with `trial_only`)."""
    if not batch_ids:
        return {}
    where = [BatchRequest.batch_id.in_(sorted(batch_ids)), BatchRequest.status.in_(sorted(lifecycle.REQ_OPEN))]
    if trial_only:
        where.append(BatchRequest.trial.is_(True))
    rows = session.execute(select(BatchRequest.batch_id, func.count()).where(*where).group_by(BatchRequest.batch_id))
    return {batch_id: int(count) for batch_id, count in rows}


def trial_results(session: Session, *, batch_id: str, trial_only: bool = True) -> list[TrialRow]:
    """The batch's ended trial lines (a trial holds at most a few thousand), in line order; with `trial_only`
    False every ended line of the batch (bench/trial_projection.py sets the projection against each line)."""
    rows = session.execute(
        select(
            BatchRequest.model,
            BatchRequest.status,
            BatchRequest.error_code,
            BatchRequest.response_status,
            BatchRequest.prompt_tokens,
            BatchRequest.completion_tokens,
            BatchRequest.cached_tokens,
            BatchRequest.check_attempts,
            BatchRequest.est_input_tokens,
            BatchRequest.max_output_tokens,
        )
        .where(
            BatchRequest.batch_id == batch_id,
            BatchRequest.trial.is_(True) if trial_only else true(),
            BatchRequest.status.in_(sorted(lifecycle.REQ_TERMINAL)),
        )
        .order_by(BatchRequest.line)
    )
    return [TrialRow(*row) for row in rows]


def stated_tokens(session: Session, *, batch_id: str) -> list[tuple[str, int, int]]:
    """Per model, what all the batch's lines state up front: (model, estimated prompt tokens, output budgets)."""
    rows = session.execute(
        select(BatchRequest.model, func.sum(BatchRequest.est_input_tokens), func.sum(BatchRequest.max_output_tokens))
        .where(BatchRequest.batch_id == batch_id)
        .group_by(BatchRequest.model)
    )
    return [(model, int(tokens_in or 0), int(tokens_out or 0)) for model, tokens_in, tokens_out in rows]
