"""Reaping: put requests whose worker vanished back in the queue (or give up after too many tries), and
expire overdue batches, whose unfinished requests become `batch_expired` error lines (those still generating
after their workers' grace to cut them short: storage/queue/expiry.py).

A lease that lapsed while its worker's heartbeat is fresh was a handover (the worker paused, it did not
crash): the request goes back without using up an attempt. A lease of a worker that is gone (stale
heartbeat, or replaced by a restart in its slot) is released at once and counts as an interrupted try.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from sqlalchemy import ColumnElement, or_, select, update
from sqlalchemy.orm import Session

from storage import lifecycle
from storage.clock import now, now_f
from storage.models import Batch, BatchRequest
from storage.queue import lease_expiry
from storage.queue.batch_counts import add_counts
from storage.queue.batch_rows import close_open_requests
from storage.queue.checkpoints import drop_ended
from storage.queue.enqueue import lock_batches_of
from storage.queue.expiry import closing_now
from storage.queue.workers import live_worker_ids


def release_expired_leases(session: Session, *, max_attempts: int, stale_seconds: float | None = None) -> int:
    """Put requests whose lease expired back in the queue (or fail them after `max_attempts`).

    With `stale_seconds`, rows of a worker whose heartbeat is fresher than that are a handover: re-queued
    with their attempt given back, never failed.
    """
    leases = lease_expiry.lock_expired(session)  # a renewal committing first keeps its lease (skipped)
    expired = (lease_expiry.without_lease(leases),)  # of running rows: the statements below pick those
    handed_over = 0
    if stale_seconds is not None:
        live = BatchRequest.lease_owner.in_(live_worker_ids(stale_seconds=stale_seconds))
        handed_over = _requeue(session, (*expired, live), attempts=BatchRequest.attempts - 1)
    released = handed_over + _requeue_or_fail(session, expired, max_attempts=max_attempts)
    lease_expiry.forget(session, lease_ids=leases)  # no running row points to them now
    return released


def release_worker_leases(session: Session, *, worker_ids: Collection[str], max_attempts: int) -> int:
    """Release every lease of these workers (gone: stale or replaced) now, not at expiry; return how many."""
    if not worker_ids:
        return 0
    owned = (BatchRequest.lease_owner.in_(list(worker_ids)),)
    released = _requeue_or_fail(session, owned, max_attempts=max_attempts)
    lease_expiry.forget(session, worker_ids=worker_ids)
    return released


def _requeue_or_fail(session: Session, where: tuple[ColumnElement[bool], ...], *, max_attempts: int) -> int:
    """Fail the matching running rows that used up their tries (engine_error lines); re-queue the rest."""
    give_up_on = (lifecycle.rows_moving(lifecycle.REQ_RUNNING, to=lifecycle.REQ_FAILED), *where)
    doomed = list(session.scalars(select(BatchRequest.id).where(*give_up_on, BatchRequest.attempts >= max_attempts)))
    if doomed:
        lock_batches_of(session, request_ids=doomed)
    give_up = (
        session.execute(
            update(BatchRequest)
            .where(*give_up_on, BatchRequest.attempts >= max_attempts)
            .values(
                status=lifecycle.REQ_FAILED,
                response_status=500,
                error_code="engine_error",
                error_message=f"The request was interrupted {max_attempts} times; giving up.",
                lease_owner=None,
                lease_id=None,
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
    if give_up:
        drop_ended(session, request_ids=doomed)
    return _requeue(session, where) + len(give_up)


def _requeue(session: Session, where: tuple[ColumnElement[bool], ...], *, attempts: Any = None) -> int:
    """Put the matching running rows back in the queue (with `attempts`, their count set to that)."""
    running = lifecycle.rows_moving(lifecycle.REQ_RUNNING, to=lifecycle.REQ_QUEUED)
    values: dict[str, Any] = {"status": lifecycle.REQ_QUEUED, "lease_owner": None, "lease_id": None}
    if attempts is not None:
        values["attempts"] = attempts
    requeued = session.execute(
        update(BatchRequest).where(running, *where).values(**values).execution_options(synchronize_session=False)
    )
    return int(requeued.rowcount or 0)  # type: ignore[attr-defined]


def expire_overdue(session: Session, *, grace_seconds: int = 0) -> list[str]:
    """End the unfinished requests of overdue batches as `batch_expired` error lines (the running ones only after
    `grace_seconds`, while their workers cut them short: storage/queue/expiry.py); return the batches.

    Not those that continue in the background: their lines go to a child (storage/batches/continuation.py), which
    sets `on_expiry` back to null when it cannot make one. The continuation skips a batch another transaction holds
    locked; if the lock went before this pass came, ending its lines here would drop them without a child."""
    overdue = list(
        session.scalars(
            select(Batch)
            .where(
                Batch.status.in_((lifecycle.VALIDATING, lifecycle.IN_PROGRESS)),
                Batch.expires_at <= now(),
                or_(Batch.status == lifecycle.VALIDATING, Batch.on_expiry.is_(None)),
            )
            .with_for_update(skip_locked=True)
        )
    )
    for batch in overdue:
        if batch.status == lifecycle.VALIDATING:
            lifecycle.transition(batch, lifecycle.EXPIRED)
            continue
        statuses, only = closing_now(batch, grace_seconds=grace_seconds)
        close_open_requests(
            session,
            batch=batch,
            statuses=statuses,
            only=only,
            status=lifecycle.REQ_EXPIRED,
            code="batch_expired",
            message="This request could not be executed before the completion window expired.",
        )
    return [batch.id for batch in overdue]
