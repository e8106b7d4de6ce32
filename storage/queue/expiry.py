"""Expiry and the lines still generating: their worker cuts them short, the reaper ends the rest
(docs/workflow.md, "Partial answers at expiry").

When a batch's window closes, the reaper ends its queued requests as `batch_expired` error lines at once, but
leaves its running ones to their workers for `expiry_cut_grace_seconds`: each worker's next lease renewal (every
2 s) finds them overdue (`overdue_of`), stops them and records what each generated so far as its answer, a
length stop marked `"backfill": {"cut_by": "expiry"}`, under the lease check like any result. What no worker
answered in the grace (no token yet, a worker gone) the reaper then ends as `batch_expired`. Either way a
request ends once: a result lands only on a running row its worker still leases, the reaper ends only open rows.
A batch whose window closed on any of its requests ends `expired`, cut answers or not (`ran_past_deadline`).
"""

from __future__ import annotations

from sqlalchemy import select
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


def closing_now(batch: Batch, *, grace_seconds: int) -> tuple[str, ...]:
    """The request statuses the reaper ends now in an overdue batch: queued ones at once, running ones once
    their workers had `grace_seconds` to cut them short."""
    if now() >= batch.expires_at + grace_seconds:
        return tuple(sorted(lifecycle.REQ_OPEN))
    return (lifecycle.REQ_QUEUED,)


def ran_past_deadline(session: Session, *, batch_id: str) -> bool:
    """True if any request of the batch finished after its window closed (cut short, or done in the grace)."""
    query = (
        select(BatchRequest.id)
        .join(Batch, Batch.id == BatchRequest.batch_id)
        .where(BatchRequest.batch_id == batch_id, BatchRequest.finished_at > Batch.expires_at)
    )
    return session.scalar(query.limit(1)) is not None
