"""Reaping: put requests whose worker vanished back in the queue (or give up after too many tries), and
expire overdue batches, whose unfinished requests become `batch_expired` error lines."""

from __future__ import annotations

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from storage import lifecycle
from storage.batches import add_counts, close_open_requests
from storage.clock import now, now_f
from storage.models import Batch, BatchRequest
from storage.queue.rows import lock_batches_of


def release_expired_leases(session: Session, *, max_attempts: int) -> int:
    """Put requests whose worker vanished back in the queue (or fail them after `max_attempts`)."""
    expired = (BatchRequest.status == lifecycle.REQ_RUNNING, BatchRequest.lease_expires_at < now_f())
    doomed = list(session.scalars(select(BatchRequest.id).where(*expired, BatchRequest.attempts >= max_attempts)))
    if doomed:
        lock_batches_of(session, request_ids=doomed)
    give_up = (
        session.execute(
            update(BatchRequest)
            .where(*expired, BatchRequest.attempts >= max_attempts)
            .values(
                status=lifecycle.REQ_FAILED,
                response_status=500,
                error_code="engine_error",
                error_message=f"The request was interrupted {max_attempts} times; giving up.",
                lease_owner=None,
                lease_expires_at=None,
                finished_at=now_f(),
            )
            .returning(BatchRequest.batch_id)
            .execution_options(synchronize_session=False)
        )
        .scalars()
        .all()
    )
    for batch_id in give_up:
        add_counts(session, batch_id=batch_id, completed=0, failed=1)
    requeued = session.execute(
        update(BatchRequest)
        .where(*expired)
        .values(status=lifecycle.REQ_QUEUED, lease_owner=None, lease_expires_at=None)
        .execution_options(synchronize_session=False)
    )
    return int(requeued.rowcount or 0) + len(give_up)  # type: ignore[attr-defined]


def expire_overdue(session: Session) -> list[str]:
    """Turn every unfinished request of an overdue batch into a `batch_expired` error line; return the batches."""
    overdue = list(
        session.scalars(
            select(Batch)
            .where(
                Batch.status.in_((lifecycle.VALIDATING, lifecycle.IN_PROGRESS)),
                Batch.expires_at <= now(),
            )
            .with_for_update(skip_locked=True)
        )
    )
    for batch in overdue:
        if batch.status == lifecycle.VALIDATING:
            lifecycle.transition(batch, lifecycle.EXPIRED)
            continue
        close_open_requests(
            session,
            batch=batch,
            statuses=tuple(lifecycle.REQ_OPEN),
            status=lifecycle.REQ_EXPIRED,
            code="batch_expired",
            message="This request could not be executed before the completion window expired.",
        )
    return [batch.id for batch in overdue]
