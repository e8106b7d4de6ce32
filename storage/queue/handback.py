"""Handing a paused batch's running requests back to the queue.

The rows lose their lease at once; their worker aborts them at its next lease renewal (within seconds) and
drops any result it still produces (`record` stores a result only under the lease), so each request still
ends in exactly one line. The interrupted try is given back: a pause is not a failure.
"""

from __future__ import annotations

from sqlalchemy import ColumnElement, exists, select, update
from sqlalchemy.orm import Session

from storage.batches import lifecycle
from storage.models import Batch, BatchRequest


def hand_back_batch(session: Session, *, batch_id: str) -> int:
    """Re-queue the batch's running requests without using up an attempt; return how many."""
    result = session.execute(
        update(BatchRequest)
        .where(BatchRequest.batch_id == batch_id, lifecycle.rows_moving(lifecycle.REQ_RUNNING, to=lifecycle.REQ_QUEUED))
        .values(
            status=lifecycle.REQ_QUEUED,
            lease_owner=None,
            lease_expires_at=None,
            attempts=BatchRequest.attempts - 1,
        )
        .execution_options(synchronize_session=False)
    )
    return int(result.rowcount or 0)  # type: ignore[attr-defined]


def hand_back_paused(session: Session, *, worker_id: str, request_ids: list[str]) -> set[str]:
    """Re-queue, unrecorded, those of this worker's running rows whose batch is paused; return their ids.

    A claim that read the batch before a pause committed can lease rows just after the pause's hand-back;
    their results must not land while the batch is paused. The caller holds the batches' locks (as `record`
    does), so a pause cannot commit between this and the store."""
    if not request_ids:
        return set()
    result = session.scalars(
        update(BatchRequest)
        .where(
            BatchRequest.id.in_(request_ids),
            lifecycle.rows_moving(lifecycle.REQ_RUNNING, to=lifecycle.REQ_QUEUED),
            BatchRequest.lease_owner == worker_id,
            ~not_paused(),
        )
        .values(
            status=lifecycle.REQ_QUEUED, lease_owner=None, lease_expires_at=None, attempts=BatchRequest.attempts - 1
        )
        .returning(BatchRequest.id)
        .execution_options(synchronize_session=False)
    )
    return set(result)


def not_paused() -> ColumnElement[bool]:
    """A filter on `batch_requests`: the row's batch is not paused (a worker must not take it back)."""
    paused = select(Batch.id).where(Batch.id == BatchRequest.batch_id, Batch.paused_at.is_not(None))
    return ~exists(paused)
