"""The queue of record: claim with leases, renew, record results, release expired leases.

Every function here is one short statement group inside the caller's transaction; none is ever held
open across inference.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from typing import Any, cast

from sqlalchemy import Table, bindparam, func, select, update
from sqlalchemy.orm import Session

from storage import lifecycle
from storage.batches import add_counts
from storage.clock import now, now_f
from storage.models import Batch, BatchRequest


@dataclass(frozen=True)
class ClaimedRequest:
    """A leased queue row, as the runner needs it."""

    id: str
    batch_id: str
    tenant_id: str
    url: str
    body: dict[str, Any]
    deadline: int


@dataclass(frozen=True)
class Outcome:
    """A finished request as the runner reports it."""

    request_id: str
    status_code: int
    body: dict[str, Any]
    prompt_tokens: int
    completion_tokens: int
    engine_seconds: float
    error_code: str | None = None
    error_message: str | None = None


def claim(session: Session, *, model: str, worker_id: str, limit: int, lease_seconds: int) -> list[ClaimedRequest]:
    """Lease up to `limit` queued requests of `model`: earliest deadline first, shared fairly by tenant.

    Each tenant with queued work gets an equal share (tenants with the nearest deadline first); shares a
    tenant cannot fill pass to the others. Rows are locked with SKIP LOCKED, so concurrent workers never
    claim the same row.
    """
    if limit <= 0:
        return []
    current = now()
    queued = (BatchRequest.model == model, BatchRequest.status == lifecycle.REQ_QUEUED, BatchRequest.deadline > current)
    tenants = list(
        session.execute(
            select(BatchRequest.tenant_id)
            .where(*queued)
            .group_by(BatchRequest.tenant_id)
            .order_by(func.min(BatchRequest.deadline))
        ).scalars()
    )
    picked: list[str] = []
    remaining = limit
    while tenants and remaining > 0:
        share = max(1, math.ceil(remaining / len(tenants)))
        still_more: list[str] = []
        for tenant_id in tenants:
            take = min(share, remaining)
            if take <= 0:
                break
            ids = list(
                session.scalars(
                    select(BatchRequest.id)
                    .where(*queued, BatchRequest.tenant_id == tenant_id, BatchRequest.id.not_in(picked))
                    .order_by(BatchRequest.deadline, BatchRequest.batch_id, BatchRequest.line)
                    .limit(take)
                    .with_for_update(skip_locked=True)
                )
            )
            picked.extend(ids)
            remaining -= len(ids)
            if len(ids) == take:
                still_more.append(tenant_id)
        tenants = still_more
    if not picked:
        return []
    return _lease(session, ids=picked, worker_id=worker_id, lease_seconds=lease_seconds)


def _lease(session: Session, *, ids: list[str], worker_id: str, lease_seconds: int) -> list[ClaimedRequest]:
    session.execute(
        update(BatchRequest)
        .where(BatchRequest.id.in_(ids))
        .values(
            status=lifecycle.REQ_RUNNING,
            lease_owner=worker_id,
            lease_expires_at=now_f() + lease_seconds,
            attempts=BatchRequest.attempts + 1,
        )
        .execution_options(synchronize_session=False)
    )
    rows = session.execute(
        select(
            BatchRequest.id,
            BatchRequest.batch_id,
            BatchRequest.tenant_id,
            BatchRequest.url,
            BatchRequest.body,
            BatchRequest.deadline,
        ).where(BatchRequest.id.in_(ids))
    ).all()
    order = {request_id: index for index, request_id in enumerate(ids)}
    claimed = [ClaimedRequest(*row) for row in rows]
    claimed.sort(key=lambda item: (item.deadline, order[item.id]))
    return claimed


def renew(session: Session, *, worker_id: str, request_ids: list[str], lease_seconds: int) -> set[str]:
    """Extend this worker's leases; return the ids it no longer holds (cancelled, expired, re-queued)."""
    if not request_ids:
        return set()
    mine = (BatchRequest.status == lifecycle.REQ_RUNNING, BatchRequest.lease_owner == worker_id)
    session.execute(
        update(BatchRequest)
        .where(BatchRequest.id.in_(request_ids), *mine)
        .values(lease_expires_at=now_f() + lease_seconds)
        .execution_options(synchronize_session=False)
    )
    held = set(session.scalars(select(BatchRequest.id).where(BatchRequest.id.in_(request_ids), *mine)))
    return set(request_ids) - held


def record(session: Session, *, worker_id: str, run_id: str, outcomes: list[Outcome]) -> dict[str, int]:
    """Store finished requests this worker still holds; return {batch_id: results stored}.

    A result for a row that was cancelled, expired or re-leased meanwhile is dropped, so each request
    ends in exactly one line however often it ran. One executemany UPDATE, then one read-back of which
    rows took the result (those now carrying this run's `finished_at` stamp).
    """
    if not outcomes:
        return {}
    lock_batches_of(session, request_ids=[o.request_id for o in outcomes])
    finished = now_f()
    table = cast(Table, BatchRequest.__table__)
    statement = (
        table.update()
        .where(
            table.c.id == bindparam("b_id"),
            table.c.status == lifecycle.REQ_RUNNING,
            table.c.lease_owner == worker_id,
        )
        .values(
            status=bindparam("b_status"),
            response_status=bindparam("b_code"),
            response_body=bindparam("b_body", type_=table.c.response_body.type),
            error_code=bindparam("b_error_code"),
            error_message=bindparam("b_error_message"),
            prompt_tokens=bindparam("b_prompt"),
            completion_tokens=bindparam("b_completion"),
            engine_seconds=bindparam("b_seconds"),
            run_id=run_id,
            lease_owner=None,
            lease_expires_at=None,
            finished_at=finished,
        )
    )
    session.connection().execute(
        statement,
        [
            {
                "b_id": o.request_id,
                "b_status": lifecycle.REQ_COMPLETED if 200 <= o.status_code < 300 else lifecycle.REQ_FAILED,
                "b_code": o.status_code,
                "b_body": o.body,
                "b_error_code": o.error_code,
                "b_error_message": o.error_message,
                "b_prompt": o.prompt_tokens,
                "b_completion": o.completion_tokens,
                "b_seconds": o.engine_seconds,
            }
            for o in outcomes
        ],
    )
    stored = session.execute(
        select(BatchRequest.batch_id, BatchRequest.status, func.count())
        .where(
            BatchRequest.id.in_([o.request_id for o in outcomes]),
            BatchRequest.run_id == run_id,
            BatchRequest.finished_at == finished,
        )
        .group_by(BatchRequest.batch_id, BatchRequest.status)
    ).all()
    counts: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for batch_id, status, count in stored:
        counts[batch_id][0 if status == lifecycle.REQ_COMPLETED else 1] += int(count)
    for batch_id, (completed, failed) in counts.items():
        add_counts(session, batch_id=batch_id, completed=completed, failed=failed)
    return {batch_id: completed + failed for batch_id, (completed, failed) in counts.items()}


def lock_batches_of(session: Session, *, request_ids: list[str]) -> None:
    """Lock the batches of these requests, in id order, before touching the requests themselves.

    Every transaction that changes both a batch and its requests takes the batch first (cancel, expiry,
    finalize, recording results), so they can wait on each other but never deadlock.
    """
    batch_ids = select(BatchRequest.batch_id).where(BatchRequest.id.in_(request_ids)).distinct()
    session.execute(select(Batch.id).where(Batch.id.in_(batch_ids)).order_by(Batch.id).with_for_update()).all()


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


def open_count(session: Session, *, batch_id: str) -> int:
    """How many of the batch's requests are still queued or running."""
    return int(
        session.scalar(
            select(func.count())
            .select_from(BatchRequest)
            .where(BatchRequest.batch_id == batch_id, BatchRequest.status.in_(lifecycle.REQ_OPEN))
        )
        or 0
    )


def batches_ready_to_finalize(session: Session) -> list[str]:
    """Ids of running/cancelling batches with no open requests left (finalize picks them up)."""
    open_exists = (
        select(BatchRequest.id)
        .where(BatchRequest.batch_id == Batch.id, BatchRequest.status.in_(lifecycle.REQ_OPEN))
        .exists()
    )
    query = select(Batch.id).where(
        Batch.status.in_((lifecycle.IN_PROGRESS, lifecycle.CANCELLING, lifecycle.FINALIZING)), ~open_exists
    )
    return list(session.scalars(query))


def has_queued(session: Session, *, model: str) -> bool:
    """True if any request of `model` waits in the queue."""
    query = (
        select(BatchRequest.id).where(BatchRequest.model == model, BatchRequest.status == lifecycle.REQ_QUEUED).limit(1)
    )
    return session.scalar(query) is not None
