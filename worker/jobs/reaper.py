"""The reaper: release the leases of gone workers and expired leases, expire overdue batches, find batches
ready to finalize."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from sqlalchemy.orm import Session

from storage.batches.continuation import continue_overdue
from storage.batches.trials import settle_trials
from storage.metrics.events import count_lease_expiries
from storage.queue import checkpoints
from storage.queue.backlog import batches_ready_to_finalize, models_waiting_unserved
from storage.queue.reaping import expire_overdue, release_expired_leases, release_worker_leases
from storage.queue.workers import forget_workers, stale_workers
from storage.settings import get_settings

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
    stale_seconds = get_settings().worker_stale_seconds
    # A worker whose heartbeat went stale is gone: its leases go back now, not when each one expires.
    gone = stale_workers(session, stale_seconds=stale_seconds)
    requeued = release_worker_leases(session, worker_ids=gone, max_attempts=MAX_ATTEMPTS)
    forget_workers(session, worker_ids=gone)
    if gone:
        log.info("reaper: %d workers stopped beating; %d of their requests back in the queue", len(gone), requeued)
    requeued += release_expired_leases(session, max_attempts=MAX_ATTEMPTS, stale_seconds=stale_seconds)
    count_lease_expiries(requeued)
    continued = continue_overdue(session, get_settings())  # on_expiry continue_in_background: into a child batch
    expired = expire_overdue(session, grace_seconds=get_settings().expiry_cut_grace_seconds)
    if continued:
        log.info("reaper: %d expired batches continue in the background: %s", len(continued), continued)
    settle_trials(session, get_settings(), batch_ids=None)  # trial lines the passes above ended (out of tries)
    checkpoints.sweep(session)  # checkpoints left by a write that raced the end of its row
    ready = batches_ready_to_finalize(session)
    # Wake a model's GPU worker only when its queue waits and no worker holds any of its rows: a busy
    # worker keeps claiming by itself, and extra wake-ups would pile up in the broker behind it.
    models = models_waiting_unserved(session)
    if requeued or expired:
        log.info("reaper: %d leases released, %d batches expired", requeued, len(expired))
    return Reaped(requeued, expired, ready, models)
