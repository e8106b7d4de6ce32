"""Worker heartbeats: one row per live GPU worker process, so its leases outlive no one.

A worker registers at start (taking over its predecessor's leases, see `predecessors`), beats every
`heartbeat_seconds`, and is presumed gone once its row is `worker_stale_seconds` old (docs/workers.md).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

from sqlalchemy import Select, delete, select, update
from sqlalchemy.orm import Session

from storage.clock import now_f
from storage.models import WorkerHeartbeat


@dataclass(frozen=True)
class WorkerIdentity:
    """Who a worker process is: its lease-owner id, host, pid and optional slot (BACKFILL_WORKER_SLOT)."""

    worker_id: str
    host: str
    pid: int
    slot: str | None = None


@dataclass(frozen=True)
class KnownWorker:
    """A heartbeat row as a starting worker sees its host's rows."""

    worker_id: str
    pid: int
    slot: str | None


def workers_on_host(session: Session, *, host: str) -> list[KnownWorker]:
    """Every worker row of `host` (a starting worker decides which of them it replaces)."""
    rows = session.execute(
        select(WorkerHeartbeat.worker_id, WorkerHeartbeat.pid, WorkerHeartbeat.slot).where(WorkerHeartbeat.host == host)
    )
    return [KnownWorker(worker_id, int(pid), slot) for worker_id, pid, slot in rows]


def beat(session: Session, *, identity: WorkerIdentity, models: Sequence[str]) -> None:
    """Stamp the worker's row now (insert it if it is new, or if the reaper had given the worker up)."""
    at = now_f()
    updated = session.execute(
        update(WorkerHeartbeat).where(WorkerHeartbeat.worker_id == identity.worker_id).values(heartbeat_at=at)
    )
    if updated.rowcount:  # type: ignore[attr-defined]
        return
    session.add(
        WorkerHeartbeat(
            worker_id=identity.worker_id,
            host=identity.host,
            pid=identity.pid,
            slot=identity.slot,
            models=",".join(models),
            started_at=at,
            heartbeat_at=at,
        )
    )
    session.flush()


def forget_workers(session: Session, *, worker_ids: Collection[str]) -> None:
    """Delete these workers' rows (they stopped, or they are gone)."""
    if worker_ids:
        session.execute(delete(WorkerHeartbeat).where(WorkerHeartbeat.worker_id.in_(list(worker_ids))))


def stale_workers(session: Session, *, stale_seconds: float) -> list[str]:
    """Workers whose last heartbeat is older than `stale_seconds`: presumed gone."""
    query = select(WorkerHeartbeat.worker_id).where(WorkerHeartbeat.heartbeat_at < now_f() - stale_seconds)
    return list(session.scalars(query.with_for_update(skip_locked=True)))


def live_worker_ids(*, stale_seconds: float) -> Select[str]:
    """A subquery of workers whose heartbeat is fresh (a lapsed lease of theirs is a handover, not a crash)."""
    return select(WorkerHeartbeat.worker_id).where(WorkerHeartbeat.heartbeat_at >= now_f() - stale_seconds)
