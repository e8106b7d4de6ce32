"""Anthropic's Message Batches API: create, retrieve, list, cancel, delete, results.

The same queue, leases, engines, finalize, reaper and cost accounting as OpenAI batches; only the shapes
differ (storage/batches/message_batches.py). The create body is streamed, never held whole.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated

import anyio.from_thread
from fastapi import APIRouter, Query, Request
from fastapi.responses import StreamingResponse

from api.anthropic.deps import Caller
from api.anthropic.schemas import DeletedMessageBatch, MessageBatch, MessageBatchList
from api.deps import Blobs, Config, DbSession
from api.paging import cursor_fields
from storage.batches.message_batches import (
    cancel_message_batch,
    create_message_batch,
    delete_message_batch,
    get_message_batch,
    list_message_batches,
    request_counts,
    results_stream,
)
from storage.errors import RequestTooLarge
from storage.finance.goodput import batch_goodput
from storage.finance.job_cost import batch_cost_json
from storage.models import Batch
from storage.settings import Settings
from storage.wakeups import wake_after_commit

router = APIRouter(prefix="/v1/messages/batches", tags=["message batches"])


@router.post("", response_model=MessageBatch)
def create(request: Request, session: DbSession, caller: Caller, blobs: Blobs, settings: Config) -> MessageBatch:
    """Create a Message Batch from inline `requests: [{custom_id, params}]`; it is validated, then queued."""
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > settings.message_batch_max_bytes:
        raise RequestTooLarge(f"Request exceeds the maximum size of {settings.message_batch_max_bytes} bytes.")
    batch = create_message_batch(session, blobs, settings, tenant_id=caller.tenant_id, chunks=_body(request))
    wake_after_commit(session, "batch.ingest", batch_id=batch.id)
    return _render(session, request, batch)


@router.get("/{message_batch_id}", response_model=MessageBatch)
def retrieve(
    message_batch_id: str, request: Request, session: DbSession, caller: Caller, settings: Config
) -> MessageBatch:
    """One Message Batch, with live request counts and (Backfill extensions) its cost block and goodput."""
    batch = get_message_batch(session, tenant_id=caller.tenant_id, batch_id=message_batch_id)
    return _render(session, request, batch, settings=settings)


@router.get("", response_model=MessageBatchList)
def list_all(
    request: Request,
    session: DbSession,
    caller: Caller,
    before_id: str | None = None,
    after_id: str | None = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 20,
) -> MessageBatchList:
    """The caller's Message Batches, newest first; page with `after_id` (older) or `before_id` (newer)."""
    rows, has_more = list_message_batches(
        session, tenant_id=caller.tenant_id, before_id=before_id, after_id=after_id, limit=limit
    )
    base = str(request.base_url)
    page = [MessageBatch.of(row, request_counts(row), base_url=base) for row in rows]
    return MessageBatchList(
        data=page,
        **cursor_fields(page, has_more=has_more),
    )


@router.post("/{message_batch_id}/cancel", response_model=MessageBatch)
def cancel(message_batch_id: str, request: Request, session: DbSession, caller: Caller) -> MessageBatch:
    """Cancel a Message Batch: queued requests end as `canceled` at once, running ones within seconds."""
    batch = cancel_message_batch(session, tenant_id=caller.tenant_id, batch_id=message_batch_id)
    wake_after_commit(session, "batch.finalize", batch_id=batch.id)
    return _render(session, request, batch)


@router.delete("/{message_batch_id}", response_model=DeletedMessageBatch)
def delete(message_batch_id: str, session: DbSession, caller: Caller, blobs: Blobs) -> DeletedMessageBatch:
    """Delete an ended Message Batch and its results (cancel a running one first). Its usage and cost stay
    in the finance reports."""
    keys = delete_message_batch(session, tenant_id=caller.tenant_id, batch_id=message_batch_id)
    for key in keys:  # as a file delete does: the rows are flushed, the objects go now
        blobs.delete(key)
    return DeletedMessageBatch(id=message_batch_id)


@router.get("/{message_batch_id}/results")
def results(
    message_batch_id: str, session: DbSession, caller: Caller, blobs: Blobs, settings: Config
) -> StreamingResponse:
    """The ended batch's results as JSONL, one `{custom_id, result}` per request, streamed."""
    stream = results_stream(session, blobs, settings, tenant_id=caller.tenant_id, batch_id=message_batch_id)
    return StreamingResponse(stream, media_type="application/x-jsonl")


def _render(session: DbSession, request: Request, batch: Batch, *, settings: Settings | None = None) -> MessageBatch:
    counts = request_counts(batch)
    extras = {}
    if settings is not None:
        goodput = batch_goodput(session, batch_id=batch.id)
        extras = {
            "cost": batch_cost_json(session, batch, settings),
            "goodput": None if goodput is None else goodput.to_json(object_name="batch.goodput"),
        }
    return MessageBatch.of(batch, counts, base_url=str(request.base_url), **extras)


def _body(request: Request) -> Iterator[bytes]:
    """The request body as it arrives, read from this worker thread off the event loop's stream."""
    stream = request.stream().__aiter__()

    async def receive() -> bytes | None:
        try:
            return await stream.__anext__()
        except StopAsyncIteration:
            return None

    while (chunk := anyio.from_thread.run(receive)) is not None:
        if chunk:
            yield chunk
