"""A paused batch's running requests go back to the queue through their worker.

A pause stops new claims of the batch at once (storage/queue/claim_order.py) and leaves each running row leased
to its worker: the worker's next lease renewal (within seconds) finds the batch paused (`paused_of`), and the
worker aborts the request and hands the row back with the tokens generated so far, in one transaction
(`storage.queue.leases.release`). Until then no other worker can claim the row, so a resume inside that window
simply lets the holder go on: a pause never has two workers decode the same request. A holder that died keeps
the row only until its lease expires (the reaper re-queues it; a claim takes it after the resume). `record`
stores no result of a paused batch: it hands such rows back unrecorded (`hand_back_paused`), so a paused batch
makes no progress. A handed-back try is given back: a pause is not a failure.

A pause holds a batch only while its window is open: once it closed, the batch's lines end as any overdue batch's
do (storage/queue/expiry.py), those holding tokens cut short from them, and their results are recorded.
"""

from __future__ import annotations

from sqlalchemy import ColumnElement, exists, select, update
from sqlalchemy.orm import Session

from storage import lifecycle
from storage.clock import now
from storage.models import Batch, BatchRequest


def paused_of(session: Session, *, worker_id: str, request_ids: list[str]) -> set[str]:
    """The ids among these whose row this worker runs and whose batch is paused: it hands them back."""
    if not request_ids:
        return set()
    # Off the lease-owner index (this worker's running rows), as a renewal reads them: no test of each row
    # against hundreds of ids.
    query = select(BatchRequest.id).where(
        BatchRequest.lease_owner == worker_id, BatchRequest.status == lifecycle.REQ_RUNNING, ~not_paused()
    )
    return set(session.scalars(query)) & set(request_ids)


def hand_back_paused(session: Session, *, worker_id: str, request_ids: list[str]) -> set[str]:
    """Re-queue, unrecorded, those of this worker's running rows whose batch is paused; return their ids.

    A holder that finished rows before its renewal noticed the pause, or a claim that read the batch before a
    pause committed, has results for a paused batch: they must not land while it is paused. The caller holds
    the batches' locks (as `record` does), so a pause cannot commit between this and the store."""
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
        .values(status=lifecycle.REQ_QUEUED, lease_owner=None, lease_id=None, attempts=BatchRequest.attempts - 1)
        .returning(BatchRequest.id)
        .execution_options(synchronize_session=False)
    )
    return set(result)


def not_paused() -> ColumnElement[bool]:
    """A filter on `batch_requests`: no pause holds the row's batch (not paused, or paused but its window closed:
    then its lines end, cut short from their tokens, storage/queue/expiry.py)."""
    paused = select(Batch.id).where(
        Batch.id == BatchRequest.batch_id, Batch.paused_at.is_not(None), Batch.expires_at > now()
    )
    return ~exists(paused)
