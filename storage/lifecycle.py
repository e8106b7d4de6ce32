"""Every batch status change goes through `transition`: it checks the move, stamps `*_at` and, for an end
state, writes the webhook event into the outbox in the same transaction.

Request (queue) rows have their own table of allowed moves, `REQ_ALLOWED`: the queue moves them many at a time
in one statement, so each statement names its move through `rows_moving`, which checks it against the table.
"""

from __future__ import annotations

from collections.abc import Iterable

from sqlalchemy import ColumnElement
from sqlalchemy.orm import object_session

from storage.batch_endings import note_ending
from storage.clock import now
from storage.errors import BatchNotCancellable, IllegalTransition
from storage.models import Batch, BatchRequest
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
# Statuses in which a batch may be paused, resumed or re-prioritised (storage/batches/control.py). Pausing is
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
    A batch leaving the statuses in which it can be paused (cancelling, finalizing, an end) is no longer paused.
    An end state wakes this process's long-polls once it commits (batch_endings.py).
    """
    if not can_transition(batch.status, target):
        error = BatchNotCancellable if target == CANCELLING else IllegalTransition
        raise error(f"Cannot move batch {batch.id} from status '{batch.status}' to '{target}'.")
    batch.status = target
    stamp = now()
    setattr(batch, _STAMP[target], stamp)
    if target not in CONTROLLABLE:
        batch.paused_at = None  # pausing means something only while the batch may still run
    session = object_session(batch)
    if target in TERMINAL and session is not None:
        record_batch_event(session, tenant_id=batch.tenant_id, batch_id=batch.id, status=target, at=stamp)
        note_ending(session)  # a long-poll waiting in this process wakes once this commits


# Request (queue row) statuses. A row is born queued (ingest, retries); every statement of storage/queue/ that
# changes a row's status names its move through `rows_moving`, which checks it against this table.
REQ_QUEUED = "queued"
REQ_RUNNING = "running"
REQ_COMPLETED = "completed"
REQ_FAILED = "failed"
REQ_EXPIRED = "expired"
REQ_CANCELLED = "cancelled"
REQ_TERMINAL = frozenset({REQ_COMPLETED, REQ_FAILED, REQ_EXPIRED, REQ_CANCELLED})
REQ_OPEN = frozenset({REQ_QUEUED, REQ_RUNNING})
REQ_INITIAL = REQ_QUEUED

# Queued rows are claimed (running) or ended unrun (cancel, expiry, a spend cap, an unserved model). Running rows
# end with their result or are ended (cancel, expiry, out of tries), or go back to the queue unended (an expired
# lease, a model switch, a pause). An ended row never moves again: a retry is a new row.
REQ_ALLOWED: dict[str, frozenset[str]] = {
    REQ_QUEUED: frozenset({REQ_RUNNING, REQ_FAILED, REQ_EXPIRED, REQ_CANCELLED}),
    REQ_RUNNING: frozenset({REQ_QUEUED, REQ_COMPLETED, REQ_FAILED, REQ_EXPIRED, REQ_CANCELLED}),
    REQ_COMPLETED: frozenset(),
    REQ_FAILED: frozenset(),
    REQ_EXPIRED: frozenset(),
    REQ_CANCELLED: frozenset(),
}


def request_move(*sources: str, to: str | Iterable[str]) -> tuple[str, ...]:
    """`sources`, once every move from them to `to` (one status or several) is in REQ_ALLOWED; else
    IllegalTransition (a statement that would break the table is a bug, caught before it runs)."""
    targets = (to,) if isinstance(to, str) else tuple(to)
    for source in sources:
        for target in targets:
            if target not in REQ_ALLOWED.get(source, frozenset()):
                raise IllegalTransition(f"A request row cannot move from status '{source}' to '{target}'.")
    if not sources:
        raise IllegalTransition(f"A move to {targets} names no status to move from.")
    return sources


def rows_moving(*sources: str, to: str) -> ColumnElement[bool]:
    """The filter on `batch_requests` of a statement that moves rows in `sources` to `to` (checked by
    `request_move`)."""
    request_move(*sources, to=to)
    return BatchRequest.status == sources[0] if len(sources) == 1 else BatchRequest.status.in_(sources)
