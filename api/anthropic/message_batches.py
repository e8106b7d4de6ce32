"""Anthropic's Message Batches API: create, retrieve, list, cancel, delete, results.

The same queue, leases, engines, finalize, reaper and cost accounting as OpenAI batches; only the shapes
differ (storage/batches/message_batches.py; how a row reads as a `MessageBatch`: api/anthropic/status.py). The
create body is streamed, never held whole.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import StreamingResponse

from api.anthropic.deps import Caller
from api.anthropic.schemas import DeletedMessageBatch, MessageBatch, MessageBatchList, MessageBatchPriority
from api.anthropic.status import require_ended_for_delete, require_ended_for_results, require_in_progress
from api.bodies import body_chunks
from api.deps import Blobs, Config, Cursor, DbSession
from api.paging import cursor_fields
from storage.batches.control import cancel_batch, pause_batch, resume_batch, set_priority
from storage.batches.message_batches import (
    create_message_batch,
    delete_message_batch,
    estimate_message_batch,
    get_message_batch,
    list_message_batches,
    results_stream,
)
from storage.batches.retries import retry_ids_of
from storage.finance.goodput import batch_goodput
from storage.finance.job_cost import batch_cost_json
from storage.models import Batch
from storage.protocols import ANTHROPIC
from storage.settings import Settings

router = APIRouter(prefix="/v1/messages/batches", tags=["message batches"])


# The body is streamed, not parsed by FastAPI, so its schema is declared here (for clients and the fuzzers).
_CREATE_BODY = {
    "type": "object",
    "required": ["requests"],
    "additionalProperties": False,
    "properties": {
        "requests": {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": "object",
                "required": ["custom_id", "params"],
                "additionalProperties": False,
                "properties": {
                    "custom_id": {"type": "string", "pattern": "^[a-zA-Z0-9_-]{1,64}$"},
                    "params": {
                        "type": "object",
                        "required": ["model", "max_tokens", "messages"],
                        "properties": {
                            "model": {"type": "string", "minLength": 1, "maxLength": 200},
                            "max_tokens": {"type": "integer", "minimum": 1},
                            "messages": {"type": "array", "minItems": 1, "items": {"type": "object"}},
                        },
                    },
                },
            },
        }
    },
}


@router.post(
    "",
    response_model=MessageBatch,
    openapi_extra={"requestBody": {"required": True, "content": {"application/json": {"schema": _CREATE_BODY}}}},
)
def create(request: Request, session: DbSession, caller: Caller, blobs: Blobs, settings: Config) -> MessageBatch:
    """Create a Message Batch from inline `requests: [{custom_id, params}]`; it is validated, then queued.

    Backfill extensions beside `requests` (the SDK's `extra_body`): `completion_window` (any the server offers, "24h"
    by default; "background": no deadline), `priority`, `max_cost_usd`, `on_expiry`, `trial`, `checks`. The body
    (up to `message_batch_max_bytes`, api/limits.py) streams through the one bounded reader."""
    batch = create_message_batch(session, blobs, settings, tenant_id=caller.tenant_id, chunks=body_chunks(request))
    return _render(session, request, batch)


@router.post(
    "/estimate",
    openapi_extra={"requestBody": {"required": True, "content": {"application/json": {"schema": _CREATE_BODY}}}},
)
def estimate(request: Request, session: DbSession, caller: Caller, settings: Config) -> dict[str, Any]:
    """Dry run (a Backfill extension): the body a create takes (`requests` and the extensions beside them, e.g.
    `completion_window`), read the same bounded way; the job's estimated cost, start and finish behind the current
    backlog, and the menu of every offered window (`windows`: predicted finish, price, admission), as
    `POST /v1/batches/estimate` answers. Nothing is created."""
    result = estimate_message_batch(session, settings, tenant_id=caller.tenant_id, chunks=body_chunks(request))
    return result.to_json()


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
    before_id: Cursor = None,
    after_id: Cursor = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 20,
) -> MessageBatchList:
    """The caller's Message Batches, newest first; page with `after_id` (older) or `before_id` (newer). Each
    carries (Backfill extensions) `retry_of` and `retries` as the single-object route does."""
    rows, has_more = list_message_batches(
        session, tenant_id=caller.tenant_id, before_id=before_id, after_id=after_id, limit=limit
    )
    base = str(request.base_url)
    retries = retry_ids_of(session, batch_ids=[row.id for row in rows])
    page = [MessageBatch.of(row, base_url=base, retries=retries[row.id]) for row in rows]
    return MessageBatchList(
        data=page,
        **cursor_fields(page, has_more=has_more),
    )


@router.post("/{message_batch_id}/cancel", response_model=MessageBatch)
def cancel(message_batch_id: str, request: Request, session: DbSession, caller: Caller) -> MessageBatch:
    """Cancel a Message Batch: queued requests end as `canceled` at once, running ones within seconds."""
    require_in_progress(get_message_batch(session, tenant_id=caller.tenant_id, batch_id=message_batch_id))
    batch = cancel_batch(session, tenant_id=caller.tenant_id, batch_id=message_batch_id, protocol=ANTHROPIC)
    return _render(session, request, batch)


@router.post("/{message_batch_id}/pause", response_model=MessageBatch)
def pause(message_batch_id: str, request: Request, session: DbSession, caller: Caller) -> MessageBatch:
    """Pause a Message Batch (a Backfill extension): no new claims, running requests handed back within
    seconds; `processing_status` stays `in_progress` with `paused_at` set, and it can still expire."""
    batch = pause_batch(session, tenant_id=caller.tenant_id, batch_id=message_batch_id, protocol=ANTHROPIC)
    return _render(session, request, batch)


@router.post("/{message_batch_id}/resume", response_model=MessageBatch)
def resume(message_batch_id: str, request: Request, session: DbSession, caller: Caller) -> MessageBatch:
    """Resume a paused Message Batch (a Backfill extension). Idempotent while it is in progress; a 400 once it
    has ended or is canceling, paused or not."""
    batch = resume_batch(session, tenant_id=caller.tenant_id, batch_id=message_batch_id, protocol=ANTHROPIC)
    return _render(session, request, batch)


@router.post("/{message_batch_id}/priority", response_model=MessageBatch)
def prioritise(
    message_batch_id: str,
    body: MessageBatchPriority,
    request: Request,
    session: DbSession,
    caller: Caller,
    settings: Config,
) -> MessageBatch:
    """Change a Message Batch's priority (a Backfill extension, -100..100, capped per tenant by the operator)."""
    batch = set_priority(
        session,
        settings,
        tenant_id=caller.tenant_id,
        batch_id=message_batch_id,
        priority=body.priority,
        protocol=ANTHROPIC,
    )
    return _render(session, request, batch)


@router.delete("/{message_batch_id}", response_model=DeletedMessageBatch)
def delete(message_batch_id: str, session: DbSession, caller: Caller, blobs: Blobs) -> DeletedMessageBatch:
    """Delete an ended Message Batch and its results (cancel a running one first). Its usage and cost stay
    in the finance reports."""
    batch = get_message_batch(session, tenant_id=caller.tenant_id, batch_id=message_batch_id, lock=True)
    require_ended_for_delete(batch)
    keys = delete_message_batch(session, batch=batch)
    for key in keys:  # as a file delete does: the rows are flushed, the objects go now
        blobs.delete(key)
    return DeletedMessageBatch(id=message_batch_id)


@router.get("/{message_batch_id}/results")
def results(
    message_batch_id: str, session: DbSession, caller: Caller, blobs: Blobs, settings: Config
) -> StreamingResponse:
    """The ended batch's results as JSONL, one `{custom_id, result}` per request, streamed."""
    batch = get_message_batch(session, tenant_id=caller.tenant_id, batch_id=message_batch_id)
    require_ended_for_results(batch)
    stream = results_stream(session, blobs, settings, batch=batch)
    return StreamingResponse(stream, media_type="application/x-jsonl")


def _render(session: DbSession, request: Request, batch: Batch, *, settings: Settings | None = None) -> MessageBatch:
    extras = {}
    if settings is not None:
        goodput = batch_goodput(session, batch_id=batch.id)
        extras = {
            "cost": batch_cost_json(session, batch, settings),
            "goodput": None if goodput is None else goodput.to_json(object_name="batch.goodput"),
        }
    retries = retry_ids_of(session, batch_ids=[batch.id])[batch.id]
    return MessageBatch.of(batch, base_url=str(request.base_url), retries=retries, **extras)
