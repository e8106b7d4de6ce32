"""Batch control, shared by every protocol: cancel, and (Backfill extensions) pause and resume, priority, and the
background tier.

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

from storage import lifecycle
from storage.batches.batches import get_batch
from storage.clock import now
from storage.errors import BatchNotCancellable, BatchNotControllable, PriorityNotAllowed
from storage.models import Batch
from storage.protocols import OPENAI, Protocol
from storage.queue import batch_rows
from storage.quotas import quota_of
from storage.settings import Settings
from storage.strict import MAX_PRIORITY as MAX_PRIORITY  # the range's home is storage/strict.py
from storage.strict import MIN_PRIORITY as MIN_PRIORITY
from storage.strict import priority_value
from storage.wakeups import wake_after_commit


def check_priority(session: Session, settings: Settings, *, tenant_id: str, priority: int) -> int:
    """The priority if this tenant may use it: InvalidValue (400) outside -100..100 (storage/strict.py),
    PriorityNotAllowed (400) past the operator's cap."""
    priority_value(priority)
    cap = quota_of(session, settings, tenant_id=tenant_id).max_priority
    if priority > cap:
        raise PriorityNotAllowed(
            f"This tenant may set priorities up to {cap}, not {priority}; ask the operator for a higher cap "
            "(BACKFILL_TENANT_MAX_PRIORITY, or max_priority in BACKFILL_TENANT_QUOTAS).",
            param="priority",
        )
    return priority


def _controllable(session: Session, *, tenant_id: str, batch_id: str, protocol: Protocol, verb: str) -> Batch:
    """The batch, locked, while it may be paused, resumed or re-prioritised; BatchNotControllable (409) once it
    ends or is ending, saying its status as the caller's protocol shows it."""
    batch = get_batch(session, tenant_id=tenant_id, batch_id=batch_id, lock=True, protocol=protocol)
    if batch.status not in lifecycle.CONTROLLABLE:
        shown = protocol.shown_status(batch.status)
        raise BatchNotControllable(f"Cannot {verb} batch {batch.id}: its {protocol.status_field} is '{shown}'.")
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
    """Let the batch be claimed again, waking its models' workers after commit; resuming a running batch that is
    not paused is a no-op, resuming one that has ended (paused or not) is BatchNotControllable, as pausing it is."""
    batch = _controllable(session, tenant_id=tenant_id, batch_id=batch_id, protocol=protocol, verb="resume")
    if batch.paused_at is not None:
        batch.paused_at = None
        session.flush()
    models = [batch.model] if batch.model is not None else batch_rows.queued_models(session, batch_id=batch.id)
    for model in models:
        wake_after_commit(session, "batch.run", model=model)
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


def cancel_batch(session: Session, *, tenant_id: str, batch_id: str, protocol: Protocol = OPENAI) -> Batch:
    """Move the batch to `cancelling`, turn its unfinished requests into cancelled error lines and wake finalize
    after commit.

    Requests already in an engine lose their lease here; their worker aborts them at its next lease
    renewal (within seconds) and any result it still produces is dropped.
    """
    batch = get_batch(session, tenant_id=tenant_id, batch_id=batch_id, lock=True, protocol=protocol)
    if not lifecycle.can_transition(batch.status, lifecycle.CANCELLING):
        shown = protocol.shown_status(batch.status)
        raise BatchNotCancellable(f"Cannot cancel batch {batch.id}: its {protocol.status_field} is '{shown}'.")
    lifecycle.transition(batch, lifecycle.CANCELLING)  # which also ends a pause
    wake_after_commit(session, "batch.finalize", batch_id=batch.id)
    batch_rows.close_open_requests(
        session,
        batch=batch,
        statuses=tuple(lifecycle.REQ_OPEN),
        status=lifecycle.REQ_CANCELLED,
        code="batch_cancelled",
        message="The batch was cancelled before this request ran.",
    )
    return batch
