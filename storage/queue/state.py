"""The queue's state as the metrics collector reads it at scrape time (storage/metrics/queue_state.py).

Each function is one cheap, grouped statement: open rows are read through the queue indexes (model,
status, ...), finished work from the small `batches` table (its live counts), never by scanning every
finished request. Deadlines are projected earliest-deadline-first at the measured throughput, as
admission and the claim order see them.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from storage import lifecycle
from storage.models import Batch, BatchRequest
from storage.planning.shapes import JobShape, work_of
from storage.planning.throughput import throughput
from storage.queue.claim_order import urgency_horizon
from storage.settings import Settings


def open_requests(session: Session) -> list[tuple[str, str, str, int]]:
    """(model, tenant id, status, count) of queued and running requests."""
    rows = session.execute(
        select(BatchRequest.model, BatchRequest.tenant_id, BatchRequest.status, func.count())
        .where(BatchRequest.status.in_(lifecycle.REQ_OPEN))
        .group_by(BatchRequest.model, BatchRequest.tenant_id, BatchRequest.status)
    ).all()
    return [(model, tenant, status, int(count)) for model, tenant, status, count in rows]


def finished_requests(session: Session) -> list[tuple[str, str, int, int]]:
    """(model, tenant id, completed, failed) over every batch: the live counts each batch keeps."""
    rows = session.execute(
        select(
            Batch.model, Batch.tenant_id, func.sum(Batch.request_completed), func.sum(Batch.request_failed)
        ).group_by(Batch.model, Batch.tenant_id)
    ).all()
    return [(model or "", tenant, int(done or 0), int(failed or 0)) for model, tenant, done, failed in rows]


def batches_by_status(session: Session) -> list[tuple[str, str, int]]:
    """(model, status, count) of batches; a batch refused before its model was known has model ""."""
    rows = session.execute(select(Batch.model, Batch.status, func.count()).group_by(Batch.model, Batch.status)).all()
    return [(model or "", status, int(count)) for model, status, count in rows]


def oldest_queued(session: Session) -> dict[str, int]:
    """Per model, when the longest-waiting queued request was enqueued (its batch's `in_progress_at`)."""
    queued = (
        select(BatchRequest.id)
        .where(BatchRequest.batch_id == Batch.id, BatchRequest.status == lifecycle.REQ_QUEUED)
        .exists()
    )
    since = func.min(func.coalesce(Batch.in_progress_at, Batch.created_at))
    rows = session.execute(
        select(Batch.model, since).where(Batch.status == lifecycle.IN_PROGRESS, queued).group_by(Batch.model)
    ).all()
    return {model: int(at) for model, at in rows if model is not None and at is not None}


@dataclass(frozen=True)
class DeadlineState:
    """One model's open work against its deadlines, projected earliest deadline first."""

    earliest_deadline: int | None  # unix seconds; None with nothing open
    slack_seconds: float | None  # min over deadlines of (time left - time to finish the work due by then)
    at_risk: int  # open requests whose deadline is inside the urgency horizon
    horizon_seconds: float
    work_per_second: float


def deadline_state(session: Session, *, model: str, settings: Settings, at: float) -> DeadlineState:
    """Earliest deadline, EDF slack and requests at risk of `model`'s open (queued or running) requests."""
    rows = session.execute(
        select(
            BatchRequest.deadline,
            func.count(),
            func.sum(BatchRequest.est_input_tokens),
            func.sum(BatchRequest.max_output_tokens),
        )
        .where(BatchRequest.model == model, BatchRequest.status.in_(lifecycle.REQ_OPEN))
        .group_by(BatchRequest.deadline)
        .order_by(BatchRequest.deadline)
    ).all()
    horizon = urgency_horizon(session, model=model, settings=settings)
    rate = throughput(session, model=model, settings=settings).work_per_second
    slack: float | None = None
    done_by = 0.0
    at_risk = 0
    for deadline, count, inputs, outputs in rows:
        done_by += work_of(JobShape(int(count), int(inputs or 0), int(outputs or 0)), settings.prefill_weight) / rate
        left = float(deadline) - at - done_by
        slack = left if slack is None else min(slack, left)
        if deadline <= at + horizon:
            at_risk += int(count)
    earliest = int(rows[0][0]) if rows else None
    return DeadlineState(earliest, slack, at_risk, horizon, rate)
