"""The reaper: release expired leases, expire overdue batches, find batches ready to finalize."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session

from storage import lifecycle
from storage.batches import close_open_requests
from storage.clock import now
from storage.models import Batch, BatchRequest
from storage.queue.backlog import batches_ready_to_finalize
from storage.queue.reaping import release_expired_leases

log = logging.getLogger(__name__)

MAX_ATTEMPTS = 3


@dataclass(frozen=True)
class Reaped:
    """What one pass did, and what needs a wake-up."""

    requeued: int
    expired_batches: list[str]
    ready_to_finalize: list[str]
    models_with_work: list[str]


def reap(session: Session) -> Reaped:
    """One reaper pass (one transaction)."""
    requeued = release_expired_leases(session, max_attempts=MAX_ATTEMPTS)
    expired = expire_overdue(session)
    ready = batches_ready_to_finalize(session)
    # Wake a model's GPU worker only when its queue waits and no worker holds any of its rows: a busy
    # worker keeps claiming by itself, and extra wake-ups would pile up in the broker behind it.
    busy = select(BatchRequest.model).where(BatchRequest.status == lifecycle.REQ_RUNNING).distinct()
    models = list(
        session.scalars(
            select(BatchRequest.model)
            .where(BatchRequest.status == lifecycle.REQ_QUEUED, BatchRequest.model.not_in(busy))
            .distinct()
        )
    )
    if requeued or expired:
        log.info("reaper: %d leases released, %d batches expired", requeued, len(expired))
    return Reaped(requeued, expired, ready, models)


def expire_overdue(session: Session) -> list[str]:
    """Turn every unfinished request of an overdue batch into a `batch_expired` error line."""
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
