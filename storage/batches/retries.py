"""Retries: a new batch that re-runs only the failed requests of an ended batch, keeping its successes.

A retry copies the failed requests' queue rows (same line number, custom_id and body) under a new batch
linked to its origin by `retry_of`; it is queued at once (the lines were validated when the origin was).
A success is never copied, so it is never run or billed again. The merged view reads a batch and every
retry below it, each line once, from the latest attempt that finished it.

Retried by default: requests that ended because their batch expired or was cancelled (`batch_expired`,
`batch_cancelled`), the budget stopped it (`budget_exceeded`) or the engine or server failed (a 5xx or no
response). Client errors (`context_length_exceeded`, bad parameters, 4xx) only when named in `codes`.
"""

from __future__ import annotations

from collections.abc import Iterator

from sqlalchemy import select
from sqlalchemy.orm import Session

from storage.batches import lifecycle
from storage.batches.batches import create_batch, get_batch
from storage.errors import BatchNotRetryable, NothingToRetry
from storage.models import Batch
from storage.protocols import Protocol, protocol_of
from storage.queue.result_pages import MergedRow, merged_pages
from storage.queue.retry_rows import requeue_copies

RETRYABLE_CODES = frozenset({"batch_expired", "batch_cancelled", "budget_exceeded"})
_ENDED = (lifecycle.COMPLETED, lifecycle.EXPIRED, lifecycle.CANCELLED)
_COPY_CHUNK = 2000


def is_retryable(row: MergedRow, *, codes: frozenset[str]) -> bool:
    """Whether a request's latest attempt is an error line a retry re-runs (`codes`: named extra codes)."""
    (_, _, status_code, _, error_code, _), status, _ = row
    if status == lifecycle.REQ_COMPLETED:
        return False
    if status in (lifecycle.REQ_EXPIRED, lifecycle.REQ_CANCELLED) or error_code in RETRYABLE_CODES:
        return True
    return status_code is None or status_code >= 500 or (error_code is not None and error_code in codes)


def retry_batch(session: Session, *, tenant_id: str, batch_id: str, protocol: Protocol, codes: list[str]) -> Batch:
    """Create and queue a retry of an ended batch: its requests whose latest attempt (over the batch and its
    retries) is a retryable error line. BatchNotRetryable (409) while any of them runs; NothingToRetry (400)."""
    origin = get_batch(session, tenant_id=tenant_id, batch_id=batch_id, lock=True, protocol=protocol)
    tree = retry_tree(session, batch=origin)
    if tree[0].id != origin.id:  # one retry at a time per tree: every retry of it takes the original's lock
        get_batch(session, tenant_id=tenant_id, batch_id=tree[0].id, lock=True)
    running = [batch for batch in tree if batch.status not in _ENDED and batch.status != lifecycle.FAILED]
    if origin.status not in _ENDED or running:
        what = f"is {origin.status}" if origin.status not in _ENDED else f"has a retry {running[0].id} still running"
        raise BatchNotRetryable(
            f"Batch {origin.id} {what}: only an ended batch (completed, expired or cancelled) whose retries "
            "have ended can be retried."
        )
    if origin.archived_at is not None:
        raise BatchNotRetryable(f"The requests of batch {origin.id} were archived: it can no longer be retried.")
    retry = create_batch(
        session,
        tenant_id=tenant_id,
        input_file_id=origin.input_file_id,
        endpoint=origin.endpoint,
        completion_window=origin.completion_window,
        model=origin.model,
        metadata=origin.metadata_,
        output_expires_after_seconds=origin.output_expires_after_seconds,
        protocol=protocol_of(origin),
    )
    retry.retry_of = origin.id
    retry.attempt = max(batch.attempt for batch in tree) + 1
    total = 0
    subtree = [batch.id for batch in retry_family(session, batch=origin)]
    for chunk in _chunks(_failed_ids(tree, subtree, codes=frozenset(codes))):
        total += requeue_copies(session, batch=retry, request_ids=chunk)
    if not total:
        raise NothingToRetry(
            f"No request of batch {origin.id} ended as an error line a retry re-runs "
            f"(by default: batch_expired, batch_cancelled, budget_exceeded and server errors; name client "
            f"error codes in `codes`).",
            param="codes",
        )
    retry.request_total = total
    lifecycle.transition(retry, lifecycle.IN_PROGRESS)
    session.flush()
    return retry


def _failed_ids(tree: list[Batch], subtree: list[str], *, codes: frozenset[str]) -> Iterator[str]:
    lines_of = None if subtree[0] == tree[0].id else subtree
    for page in merged_pages(batches={batch.id: batch.attempt for batch in tree}, lines_of=lines_of):
        for row in page:
            if is_retryable(row, codes=codes):
                yield row[0][0]


def _chunks(ids: Iterator[str]) -> Iterator[list[str]]:
    chunk: list[str] = []
    for request_id in ids:
        chunk.append(request_id)
        if len(chunk) >= _COPY_CHUNK:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def retry_family(session: Session, *, batch: Batch) -> list[Batch]:
    """The batch and every retry below it (retries of retries too), in attempt order."""
    family, frontier = [batch], [batch.id]
    while frontier:
        children = list(session.scalars(select(Batch).where(Batch.retry_of.in_(frontier))))
        family += children
        frontier = [child.id for child in children]
    return sorted(family, key=lambda b: b.attempt)


def retry_tree(session: Session, *, batch: Batch) -> list[Batch]:
    """The whole retry tree the batch belongs to (from its original batch down), in attempt order."""
    root = batch
    while root.retry_of is not None:
        root = get_batch(session, tenant_id=root.tenant_id, batch_id=root.retry_of)
    return retry_family(session, batch=root)


def retry_ids_of(session: Session, *, batch_ids: list[str]) -> dict[str, list[str]]:
    """{batch_id: its direct retries' ids, oldest first} for a page of batches (one query)."""
    found: dict[str, list[str]] = {batch_id: [] for batch_id in batch_ids}
    if not batch_ids:
        return found
    query = select(Batch.retry_of, Batch.id).where(Batch.retry_of.in_(batch_ids)).order_by(Batch.created_at, Batch.id)
    for origin, retry in session.execute(query).all():
        if origin is not None:
            found[origin].append(retry)
    return found
