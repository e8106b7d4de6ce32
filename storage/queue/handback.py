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
        .where(BatchRequest.batch_id == batch_id, BatchRequest.status == lifecycle.REQ_RUNNING)
        .values(
            status=lifecycle.REQ_QUEUED,
            lease_owner=None,
            lease_expires_at=None,
            attempts=BatchRequest.attempts - 1,
        )
        .execution_options(synchronize_session=False)
    )
    return int(result.rowcount or 0)  # type: ignore[attr-defined]


def not_paused() -> ColumnElement[bool]:
    """A filter on `batch_requests`: the row's batch is not paused (a worker must not take it back)."""
    paused = select(Batch.id).where(Batch.id == BatchRequest.batch_id, Batch.paused_at.is_not(None))
    return ~exists(paused)
