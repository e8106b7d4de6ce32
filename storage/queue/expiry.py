"""Expiry and the lines still generating: their worker cuts them short, the reaper ends the rest
(docs/workflow.md, "Partial answers at expiry").

When a batch's window closes, the reaper ends its queued requests as `batch_expired` error lines at once, but
leaves its running ones to their workers for `expiry_cut_grace_seconds`: each worker's next lease renewal (every
2 s) finds them overdue (`overdue_of`), stops them and records what each generated so far as its answer, a
length stop marked `"backfill": {"cut_by": "expiry"}`, under the lease check like any result. A queued request
holding a checkpoint (handed back mid-generation: a drain, a switch, a pause) is left too: a claim of its model
leases it (`cut_candidates`), and its worker answers it at once from the checkpoint, cut the same way, decoding
nothing past the deadline. A paused batch's lines are no exception: once its window closed a pause holds nothing
back (storage/queue/handback.py `not_paused`), so the lines its pause handed back with tokens end with them, as
lines cut while running do. What no worker answered in the grace (no token yet, a worker gone) the reaper then
ends as `batch_expired`. Either way a request ends once: a result lands only on a running row its worker still
leases, the reaper ends only open rows. A batch whose window closed on any of its requests ends `expired`, cut
answers or not (`ran_past_deadline`).
"""

from __future__ import annotations

from sqlalchemy import ColumnElement, select
from sqlalchemy.orm import Session

from storage import lifecycle
from storage.clock import now
from storage.models import Batch, BatchRequest

CONTINUE_IN_BACKGROUND = "continue_in_background"
ON_EXPIRY = (CONTINUE_IN_BACKGROUND,)  # besides the default (null): cut short


def overdue_of(session: Session, *, worker_id: str, request_ids: list[str]) -> set[str]:
    """The ids among these whose row this worker runs and whose batch's window closed: it cuts them short.

    Not those of a batch that continues in the background: the reaper moves its lines to the child at once."""
    if not request_ids:
        return set()
    query = (
        select(BatchRequest.id)
        .join(Batch, Batch.id == BatchRequest.batch_id)
        .where(
            BatchRequest.lease_owner == worker_id,
            BatchRequest.status == lifecycle.REQ_RUNNING,
            Batch.status == lifecycle.IN_PROGRESS,
            Batch.expires_at <= now(),
            Batch.on_expiry.is_(None),
        )
    )
    return set(session.scalars(query)) & set(request_ids)


def cut_candidates(session: Session, *, model: str, limit: int) -> list[str]:
    """Queued rows of `model` holding a checkpoint in batches whose window closed (paused or not; not those
    continuing in the background): a claim leases them so their worker cuts them short from those tokens at once.
    Locked, SKIP LOCKED."""
    if limit <= 0:
        return []
    overdue = select(Batch.id).where(
        Batch.status == lifecycle.IN_PROGRESS,
        Batch.expires_at <= now(),
        Batch.on_expiry.is_(None),
    )
    query = (
        select(BatchRequest.id)
        .where(
            BatchRequest.model == model,
            BatchRequest.status == lifecycle.REQ_QUEUED,
            BatchRequest.checkpoint_tokens > 0,
            BatchRequest.batch_id.in_(overdue),
        )
        .order_by(BatchRequest.batch_id, BatchRequest.line)
        .limit(limit)
        .with_for_update(skip_locked=True)
    )
    return list(session.scalars(query))


def closing_now(batch: Batch, *, grace_seconds: int) -> tuple[tuple[str, ...], tuple[ColumnElement[bool], ...]]:
    """Which requests the reaper ends now in an overdue batch (their statuses, and a filter): queued ones with no
    token generated at once; running ones, and queued ones holding a checkpoint (a claim takes them to be cut),
    once their workers had `grace_seconds` to cut them short."""
    if now() >= batch.expires_at + grace_seconds:
        return tuple(sorted(lifecycle.REQ_OPEN)), ()
    return (lifecycle.REQ_QUEUED,), (BatchRequest.checkpoint_tokens == 0,)


def ran_past_deadline(session: Session, *, batch_id: str) -> bool:
    """True if any request of the batch finished after its window closed (cut short, or done in the grace)."""
    if (session.scalar(select(Batch.expires_at).where(Batch.id == batch_id)) or 0) > now():
        return False  # the window is still open: nothing finished past it (no read of the batch's rows)
    query = (
        select(BatchRequest.id)
        .join(Batch, Batch.id == BatchRequest.batch_id)
        .where(BatchRequest.batch_id == batch_id, BatchRequest.finished_at > Batch.expires_at)
    )
    return session.scalar(query.limit(1)) is not None
