"""A model's backlog summed once for the whole fleet, not once per worker process (issue 41).

Each worker process needs its model's open backlog for the urgency horizon (storage/queue/claim_order.py), at most
`max_age_seconds` old. Summed by each process for itself, a fleet of N processes summed the queue N times per
interval (each sum reads every open row's entry: storage/queue/backlog.py `backlog`). The last sum is kept in one
row per model (`model_backlogs`); the claim that finds it too old takes that row (`FOR UPDATE SKIP LOCKED`, in the
claim's own transaction), sums the queue again and stores it, while the others go on with the last sum until that
commits. Postgres only: on SQLite (one embedded process) the caller sums for itself.
"""

from __future__ import annotations

from sqlalchemy import Row, select, update
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Session

from storage.clock import now_f
from storage.models import ModelBacklog
from storage.planning.shapes import JobShape
from storage.queue.backlog import backlog
from storage.settings import Settings

_COLUMNS = (
    ModelBacklog.requests,
    ModelBacklog.input_tokens,
    ModelBacklog.output_tokens,
    ModelBacklog.lora_work,
    ModelBacklog.summed_at,
)


def fleet_backlog(
    session: Session, settings: Settings, *, model: str, max_age_seconds: float
) -> tuple[JobShape, float]:
    """The model's open backlog as the fleet last summed it, and how many seconds ago; summed again here (age 0) if
    that is `max_age_seconds` or more and no other process is at it."""
    query = select(*_COLUMNS).where(ModelBacklog.model == model)
    last = session.execute(query).one_or_none()
    if last is not None and now_f() - last.summed_at < max_age_seconds:
        return _shape(last, model), now_f() - last.summed_at
    if last is None:  # the model's first sum (a concurrent first insert waits for the other, then does nothing)
        first = {"model": model, "requests": 0, "input_tokens": 0, "output_tokens": 0, "lora_work": 0.0}
        session.execute(insert(ModelBacklog).values(**first, summed_at=0.0).on_conflict_do_nothing())
    taken = session.execute(query.with_for_update(skip_locked=True)).one_or_none()
    if taken is None and last is not None:  # another process is summing: the last sum meanwhile
        return _shape(last, model), now_f() - last.summed_at
    if taken is not None and now_f() - taken.summed_at < max_age_seconds:  # stored since we looked
        return _shape(taken, model), now_f() - taken.summed_at
    summed = backlog(session, settings, model=model)
    if taken is not None:
        session.execute(
            update(ModelBacklog)
            .where(ModelBacklog.model == model)
            .values(
                requests=summed.requests,
                input_tokens=summed.input_tokens,
                output_tokens=summed.output_tokens,
                lora_work=summed.lora_work,
                summed_at=now_f(),
            )
        )
    return summed, 0.0


def _shape(row: Row[int, int, int, float, float], model: str) -> JobShape:
    return JobShape(
        int(row.requests), int(row.input_tokens), int(row.output_tokens), model, lora_work=float(row.lora_work)
    )
