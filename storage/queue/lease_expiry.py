"""Lease expiry: one `leases` row per claim, which the queue rows it leased point to (`batch_requests.lease_id`).

A worker renews its leases by moving the expiry of the few lease rows it holds (a claim of up to 2 x max_num_seqs
rows, refilled by halves: about four per runner), not by rewriting every row in flight, so a renewal writes
O(claims) rows whatever the rows in flight. What stores a result is unchanged: `record` checks that the row is
still `running` under this worker (`lease_owner`); the expiry only decides when the reaper may take a row back.

The reaper locks the expired leases it releases (`FOR UPDATE SKIP LOCKED`), so a renewal that commits first
keeps them, and one that comes after finds their rows re-queued (the worker takes them back or drops them, as
before). A lease with no running rows left goes with its worker's next renewal (`drop_empty`) or, expired, with
the reaper's next pass.
"""

from __future__ import annotations

from collections.abc import Collection

from sqlalchemy import ColumnElement, delete, exists, insert, or_, select, update
from sqlalchemy.orm import Session

from storage import lifecycle
from storage.clock import now_f
from storage.ids import new_id
from storage.models import BatchRequest, Lease


def open_lease(session: Session, *, worker_id: str, lease_seconds: float, lease_id: str | None = None) -> str:
    """Insert a lease of this worker expiring in `lease_seconds`; return its id (rows point to it)."""
    lease_id = lease_id or new_id("lease_")
    session.execute(insert(Lease).values(id=lease_id, worker_id=worker_id, expires_at=now_f() + lease_seconds))
    return lease_id


def extend(session: Session, *, worker_id: str, lease_ids: Collection[str], lease_seconds: float) -> int:
    """Move these leases' expiry to now + `lease_seconds` (this worker's only); return how many."""
    if not lease_ids:
        return 0
    result = session.execute(
        update(Lease)
        .where(Lease.id.in_(sorted(lease_ids)), Lease.worker_id == worker_id)
        .values(expires_at=now_f() + lease_seconds)
        .execution_options(synchronize_session=False)
    )
    return int(result.rowcount or 0)  # type: ignore[attr-defined]


def drop_empty(session: Session, *, worker_id: str, keep: Collection[str]) -> None:
    """Delete this worker's leases, other than `keep`, that no running row points to any more.

    A claim inserts its lease and points its rows at it in one transaction, so a lease is never seen without
    its rows."""
    running = exists(
        select(BatchRequest.id).where(BatchRequest.lease_id == Lease.id, BatchRequest.status == lifecycle.REQ_RUNNING)
    )
    statement = delete(Lease).where(Lease.worker_id == worker_id, ~running)
    if keep:
        statement = statement.where(Lease.id.not_in(sorted(keep)))
    session.execute(statement.execution_options(synchronize_session=False))


def lock_expired(session: Session) -> list[str]:
    """The leases whose expiry passed, locked (those a renewal holds right now are skipped: it keeps them)."""
    query = select(Lease.id).where(Lease.expires_at < now_f()).with_for_update(skip_locked=True)
    return list(session.scalars(query))


def without_lease(lease_ids: Collection[str]) -> ColumnElement[bool]:
    """A filter on running `batch_requests`: its lease is one of these (expired), or it has none."""
    return or_(BatchRequest.lease_id.in_(sorted(lease_ids)), BatchRequest.lease_id.is_(None))


def forget(session: Session, *, lease_ids: Collection[str] = (), worker_ids: Collection[str] = ()) -> None:
    """Delete these leases, and every lease of these workers (their rows were re-queued or ended)."""
    if lease_ids:
        session.execute(delete(Lease).where(Lease.id.in_(sorted(lease_ids))))
    if worker_ids:
        session.execute(delete(Lease).where(Lease.worker_id.in_(sorted(worker_ids))))
