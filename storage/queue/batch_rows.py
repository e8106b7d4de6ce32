"""One batch's rows as a whole: the models it queues, rows no worker can serve, closing its open rows (on
cancel and expiry), and scrubbing the content of a deleted or archived batch."""

from __future__ import annotations

from collections.abc import Collection

from sqlalchemy import ColumnElement, select, update
from sqlalchemy.orm import Session

from storage import lifecycle
from storage.clock import now, now_f
from storage.models import Batch, BatchRequest
from storage.queue.batch_counts import add_counts
from storage.queue.checkpoints import drop_ended

UNSERVED_CODE = "model_not_found"


def queued_models(session: Session, *, batch_id: str) -> list[str]:
    """The models the batch has queued requests for (each needs its GPU worker woken)."""
    query = (
        select(BatchRequest.model)
        .where(BatchRequest.batch_id == batch_id, BatchRequest.status == lifecycle.REQ_QUEUED)
        .distinct()
    )
    return sorted(session.scalars(query))


def fail_unserved(session: Session, *, batch_id: str, served: Collection[str]) -> int:
    """End the batch's queued requests for models this deployment does not serve as 404 results.

    A batch may mix models: a request naming one nobody serves must end (a 404 in its protocol's words)
    instead of waiting for a worker that never comes. Returns how many requests it ended.
    """
    queued = (BatchRequest.batch_id == batch_id, BatchRequest.status == lifecycle.REQ_QUEUED)
    unserved = select(BatchRequest.model).where(*queued, BatchRequest.model.not_in(served)).distinct()
    missing = list(session.scalars(unserved))
    offered = ", ".join(sorted(served))
    ended = 0
    for model in missing:
        result = session.execute(
            update(BatchRequest)
            .where(
                BatchRequest.batch_id == batch_id,
                lifecycle.rows_moving(lifecycle.REQ_QUEUED, to=lifecycle.REQ_FAILED),
                BatchRequest.model == model,
            )
            .values(
                status=lifecycle.REQ_FAILED,
                response_status=404,
                error_code=UNSERVED_CODE,
                error_message=f"model: '{model}' is not served here (served models: {offered})",
                finished_at=now_f(),
            )
            .execution_options(synchronize_session=False)
        )
        ended += int(result.rowcount or 0)  # type: ignore[attr-defined]
    if ended:
        drop_ended(session, batch_id=batch_id)
        add_counts(session, batch_id=batch_id, completed=0, failed=ended)
    return ended


def end_queued(session: Session, *, batch: Batch, code: str, message: str) -> int:
    """End the batch's queued (never running) requests as failed error lines with `code`, as cancel closes
    them; rows in an engine are left to finish. Returns how many ended."""
    statuses = (lifecycle.REQ_QUEUED,)
    return close_open_requests(
        session, batch=batch, statuses=statuses, status=lifecycle.REQ_FAILED, code=code, message=message
    )


def scrub_content(session: Session, *, batch_id: str) -> None:
    """Drop the prompts and answers a batch's rows hold; tokens, timings and runs stay for cost accounting."""
    session.execute(
        update(BatchRequest)
        .where(BatchRequest.batch_id == batch_id)
        .values(body={}, response_body=None, error_message=None)
        .execution_options(synchronize_session=False)
    )
    drop_ended(session, batch_id=batch_id)  # generated tokens are content too (an ended row has none left)


def close_open_requests(
    session: Session,
    *,
    batch: Batch,
    statuses: tuple[str, ...],
    status: str,
    code: str,
    message: str,
    only: tuple[ColumnElement[bool], ...] = (),
) -> int:
    """End the batch's requests in `statuses` (and matching `only`) as error lines with `code`; return how many."""
    result = session.execute(
        update(BatchRequest)
        .where(BatchRequest.batch_id == batch.id, lifecycle.rows_moving(*statuses, to=status), *only)
        .values(
            status=status,
            error_code=code,
            error_message=message,
            lease_owner=None,
            lease_id=None,
            finished_at=now(),
        )
        .execution_options(synchronize_session=False)
    )
    count = int(result.rowcount or 0)  # type: ignore[attr-defined]
    if count:
        drop_ended(session, batch_id=batch.id)
        session.flush()
        ended = {"cancelled": count} if status == lifecycle.REQ_CANCELLED else {}
        ended = {"expired": count} if status == lifecycle.REQ_EXPIRED else ended
        add_counts(session, batch_id=batch.id, completed=0, failed=count, **ended)
        session.refresh(batch)
    return count
