"""Every batch status change goes through `transition`: it checks the move, stamps `*_at` and, for an end
state, writes the webhook event into the outbox in the same transaction."""

from __future__ import annotations

from sqlalchemy.orm import object_session

from storage.clock import now
from storage.errors import BatchNotCancellable, IllegalTransition
from storage.models import Batch
from storage.webhooks.events import record_batch_event

VALIDATING = "validating"
FAILED = "failed"
IN_PROGRESS = "in_progress"
FINALIZING = "finalizing"
COMPLETED = "completed"
EXPIRED = "expired"
CANCELLING = "cancelling"
CANCELLED = "cancelled"

TERMINAL = frozenset({FAILED, COMPLETED, EXPIRED, CANCELLED})
# Statuses in which a batch may be paused, resumed or re-prioritised (storage/batch_control.py). Pausing is
# no status of its own: the batch stays `in_progress` (an SDK-valid status) with `paused_at` set.
CONTROLLABLE = frozenset({VALIDATING, IN_PROGRESS})

# Completed batches pass through `finalizing` while their files are written. Expired and cancelled
# batches write their partial files while still `in_progress`/`cancelling`, then move straight on.
ALLOWED: dict[str, frozenset[str]] = {
    VALIDATING: frozenset({IN_PROGRESS, FAILED, CANCELLING, EXPIRED}),
    IN_PROGRESS: frozenset({FINALIZING, CANCELLING, EXPIRED}),
    FINALIZING: frozenset({COMPLETED}),
    CANCELLING: frozenset({CANCELLED}),
    FAILED: frozenset(),
    COMPLETED: frozenset(),
    EXPIRED: frozenset(),
    CANCELLED: frozenset(),
}

_STAMP = {
    IN_PROGRESS: "in_progress_at",
    FAILED: "failed_at",
    FINALIZING: "finalizing_at",
    COMPLETED: "completed_at",
    EXPIRED: "expired_at",
    CANCELLING: "cancelling_at",
    CANCELLED: "cancelled_at",
}


def can_transition(current: str, target: str) -> bool:
    """True if a batch in `current` may move to `target`."""
    return target in ALLOWED.get(current, frozenset())


def transition(batch: Batch, target: str) -> None:
    """Move `batch` to `target`, stamping its timestamp; raise IllegalTransition otherwise.

    An end state also adds its webhook event (and deliveries) to the batch's session, so the event
    commits or rolls back with the status change itself. A batch in no session (unit tests) has no outbox.
    """
    if not can_transition(batch.status, target):
        error = BatchNotCancellable if target == CANCELLING else IllegalTransition
        raise error(f"Cannot move batch {batch.id} from status '{batch.status}' to '{target}'.")
    batch.status = target
    stamp = now()
    setattr(batch, _STAMP[target], stamp)
    session = object_session(batch)
    if target in TERMINAL and session is not None:
        record_batch_event(session, tenant_id=batch.tenant_id, batch_id=batch.id, status=target, at=stamp)


# Request (queue row) statuses.
REQ_QUEUED = "queued"
REQ_RUNNING = "running"
REQ_COMPLETED = "completed"
REQ_FAILED = "failed"
REQ_EXPIRED = "expired"
REQ_CANCELLED = "cancelled"
REQ_TERMINAL = frozenset({REQ_COMPLETED, REQ_FAILED, REQ_EXPIRED, REQ_CANCELLED})
REQ_OPEN = frozenset({REQ_QUEUED, REQ_RUNNING})
