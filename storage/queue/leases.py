"""Leases: a worker renews the rows it runs, takes back rows the reaper re-queued while it still ran them, and
releases rows it hands back. Results are recorded only while the lease holds (storage/queue/results.py).
"""

from __future__ import annotations

from collections.abc import Mapping

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from storage import lifecycle
from storage.models import BatchRequest
from storage.queue import lease_expiry
from storage.queue.checkpoints import Generated, save
from storage.queue.claim_caps import within_caps
from storage.queue.enqueue import ids_match
from storage.queue.handback import not_paused
from storage.settings import get_settings


def renew(
    session: Session,
    *,
    worker_id: str,
    request_ids: list[str],
    lease_seconds: int,
    checkpoints: Mapping[str, Generated] | None = None,
) -> set[str]:
    """Extend this worker's leases; return the ids it no longer holds (cancelled, expired, re-queued).

    One read of this worker's running rows (which of these it still holds, and under which leases), then one
    write per lease they point to (a claim's: storage/queue/lease_expiry.py), not per row; leases of this worker
    no running row points to any more go. `checkpoints` (periodic ones, of rows among these) are stored on the way.
    """
    if not request_ids:
        return set()
    given = checkpoints or {}
    if due := {rid: given[rid] for rid in set(request_ids) & set(given)}:
        save(session, checkpoints=due)
    # This worker's running rows, off the lease-owner index: no membership test of hundreds of ids per row.
    mine = dict(
        session.execute(
            select(BatchRequest.id, BatchRequest.lease_id).where(
                BatchRequest.lease_owner == worker_id, BatchRequest.status == lifecycle.REQ_RUNNING
            )
        ).all()
    )
    named = set(request_ids)
    lease_ids = {lease_id for rid, lease_id in mine.items() if rid in named and lease_id}
    lease_expiry.extend(session, worker_id=worker_id, lease_ids=lease_ids, lease_seconds=lease_seconds)
    lease_expiry.drop_empty(session, worker_id=worker_id, keep=lease_ids)
    return named - set(mine)


def take_back(session: Session, *, worker_id: str, request_ids: list[str], lease_seconds: int) -> set[str]:
    """Lease back rows this worker still runs that the reaper re-queued meanwhile; return the ids retaken.

    The worker never stopped working on them, so this is the same try: `attempts` is left as it was. Rows of a
    paused batch were handed back on purpose (storage/queue/handback.py) and are not taken back, nor rows of a
    capped batch whose room was leased to other rows meanwhile (`within_caps`): the worker drops those.
    """
    if request_ids:
        request_ids = within_caps(session, get_settings(), request_ids=request_ids)
    if not request_ids:
        return set()
    lease = lease_expiry.open_lease(session, worker_id=worker_id, lease_seconds=lease_seconds)
    retaken = session.scalars(
        update(BatchRequest)
        .where(
            ids_match(session, request_ids),
            lifecycle.rows_moving(lifecycle.REQ_QUEUED, to=lifecycle.REQ_RUNNING),
            not_paused(),
        )
        .values(status=lifecycle.REQ_RUNNING, lease_owner=worker_id, lease_id=lease)
        .returning(BatchRequest.id)
        .execution_options(synchronize_session=False)
    )
    return set(retaken)


def release(
    session: Session,
    *,
    worker_id: str,
    request_ids: list[str],
    checkpoints: Mapping[str, Generated] | None = None,
) -> int:
    """Hand this worker's leased requests back to the queue (a drain, a model switch); the attempt is not counted.

    `checkpoints` (request id -> the token ids generated so far) are stored in the same transaction, so the
    claim that takes a row next continues its generation from there (storage/queue/checkpoints.py).
    """
    if not request_ids:
        return 0
    if checkpoints:
        save(session, checkpoints=checkpoints)
    released = session.execute(
        update(BatchRequest)
        .where(
            BatchRequest.id.in_(request_ids),
            lifecycle.rows_moving(lifecycle.REQ_RUNNING, to=lifecycle.REQ_QUEUED),
            BatchRequest.lease_owner == worker_id,
        )
        .values(
            status=lifecycle.REQ_QUEUED,
            lease_owner=None,
            lease_id=None,
            attempts=BatchRequest.attempts - 1,
        )
        .execution_options(synchronize_session=False)
    )
    return int(released.rowcount or 0)  # type: ignore[attr-defined]


def has_expired_requests(session: Session, *, batch_id: str) -> bool:
    """True if any of the batch's requests ended as `expired` (the batch itself expired)."""
    query = select(BatchRequest.id).where(
        BatchRequest.batch_id == batch_id, BatchRequest.status == lifecycle.REQ_EXPIRED
    )
    return session.scalar(query.limit(1)) is not None
