"""Batch control (Backfill extensions): pause and resume, priority, and the background tier.

A paused batch keeps its status (`in_progress`, which every SDK parses) and carries `paused_at`; the claim
skips it (storage/queue/claim_order.py) at once, and each request running in an engine is handed back by its
worker, with the tokens it generated, at the worker's next lease renewal (storage/queue/handback.py), so the
engine is free for other batches within one renewal and a resume before it lets the worker go on. Its
completion window keeps running: a paused batch still expires. Priority (-100..100) orders non-urgent work:
urgent-by-deadline first, then higher priority, then a fair share across tenants; the operator caps what each
tenant may set. A background batch (`completion_window: "background"`) has no deadline: it runs only when no
deadline work waits.
"""

from __future__ import annotations

from sqlalchemy.orm import Session

from storage.batches import lifecycle
from storage.batches.batches import get_batch
from storage.clock import now
from storage.errors import BatchNotControllable, PriorityNotAllowed
from storage.models import Batch
from storage.protocols import OPENAI, Protocol
from storage.quotas import quota_of
from storage.settings import Settings

MIN_PRIORITY = -100
MAX_PRIORITY = 100


def check_priority(session: Session, settings: Settings, *, tenant_id: str, priority: int) -> int:
    """The priority if this tenant may use it; PriorityNotAllowed (400) past the operator's cap."""
    cap = quota_of(session, settings, tenant_id=tenant_id).max_priority
    if not MIN_PRIORITY <= priority <= MAX_PRIORITY:
        raise PriorityNotAllowed(f"priority must be between {MIN_PRIORITY} and {MAX_PRIORITY}.", param="priority")
    if priority > cap:
        raise PriorityNotAllowed(
            f"This tenant may set priorities up to {cap}, not {priority}; ask the operator for a higher cap "
            "(BACKFILL_TENANT_MAX_PRIORITY, or max_priority in BACKFILL_TENANT_QUOTAS).",
            param="priority",
        )
    return priority


def _controllable(session: Session, *, tenant_id: str, batch_id: str, protocol: Protocol, verb: str) -> Batch:
    batch = get_batch(session, tenant_id=tenant_id, batch_id=batch_id, lock=True, protocol=protocol)
    if batch.status not in lifecycle.CONTROLLABLE:
        raise BatchNotControllable(f"Cannot {verb} batch {batch.id}: its status is '{batch.status}'.")
    return batch


def pause_batch(session: Session, *, tenant_id: str, batch_id: str, protocol: Protocol = OPENAI) -> Batch:
    """Stop claims for the batch; its workers hand its running requests back at their next lease renewal
    (storage/queue/handback.py). Pausing twice is a no-op."""
    batch = _controllable(session, tenant_id=tenant_id, batch_id=batch_id, protocol=protocol, verb="pause")
    if batch.paused_at is None:
        batch.paused_at = now()
        session.flush()  # the claim, the renewals, `take_back` and `record` read `paused_at` from the table
    return batch


def resume_batch(session: Session, *, tenant_id: str, batch_id: str, protocol: Protocol = OPENAI) -> Batch:
    """Let the batch be claimed again; resuming a batch that is not paused is a no-op."""
    batch = get_batch(session, tenant_id=tenant_id, batch_id=batch_id, lock=True, protocol=protocol)
    if batch.paused_at is None:
        return batch
    if batch.status not in lifecycle.CONTROLLABLE:
        raise BatchNotControllable(f"Cannot resume batch {batch.id}: its status is '{batch.status}'.")
    batch.paused_at = None
    session.flush()
    return batch


def set_priority(
    session: Session, settings: Settings, *, tenant_id: str, batch_id: str, priority: int, protocol: Protocol = OPENAI
) -> Batch:
    """Change a batch's priority (within the tenant's cap); its next claims follow it."""
    check_priority(session, settings, tenant_id=tenant_id, priority=priority)
    batch = _controllable(session, tenant_id=tenant_id, batch_id=batch_id, protocol=protocol, verb="re-prioritise")
    batch.priority = priority
    session.flush()
    return batch
