"""Batches: create from an uploaded file, read, list, cancel."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query

from api.deps import Blobs, Caller, Config, Cursor, DbSession
from api.errors import error_responses
from api.openai.schemas import BatchCreate, BatchList, BatchObject, BatchPriority
from api.paging import cursor_fields
from storage.batches.batches import get_batch, list_batches
from storage.batches.control import cancel_batch, pause_batch, resume_batch, set_priority
from storage.batches.creation import create_from_file, estimate_file
from storage.batches.retries import retry_ids_of
from storage.finance.goodput import batch_goodput
from storage.finance.job_cost import batch_cost_json
from storage.protocols import OPENAI
from storage.queue.usage import batch_usages

router = APIRouter(prefix="/v1/batches", tags=["batches"])


@router.post("", response_model=BatchObject)
def create(body: BatchCreate, session: DbSession, caller: Caller, blobs: Blobs, settings: Config) -> BatchObject:
    """Create a batch from an uploaded `batch` file; it is validated, then queued.

    Backfill extensions: `priority` (-100..100, via the SDK's `extra_body`) and `completion_window:
    "background"` (no deadline: runs on spare capacity only, never expires, a deeper discount), `max_cost_usd`
    (a decimal string) caps what the batch may be billed; a tenant with a monthly budget is refused (400
    `budget_exceeded`) a batch whose estimate is more than what is left."""
    terms = body.terms()
    batch = create_from_file(
        session, blobs, settings, tenant_id=caller.tenant_id, input_file_id=body.input_file_id, terms=terms
    )
    return BatchObject.of(batch)


@router.post("/estimate")
def estimate(body: BatchCreate, session: DbSession, caller: Caller, blobs: Blobs, settings: Config) -> dict[str, Any]:
    """Dry run (a Backfill extension): estimated compute cost, start and finish of this job behind the
    current backlog, from measured engine throughput. Nothing is created."""
    terms = body.terms()
    result = estimate_file(
        session, blobs, settings, tenant_id=caller.tenant_id, input_file_id=body.input_file_id, terms=terms
    )
    return result.to_json()


@router.get("/{batch_id}", response_model=BatchObject)
def retrieve(batch_id: str, session: DbSession, caller: Caller, settings: Config) -> BatchObject:
    """One batch, with live request counts and (Backfill extensions) its cost block and goodput."""
    batch = get_batch(session, tenant_id=caller.tenant_id, batch_id=batch_id, protocol=OPENAI)
    goodput = batch_goodput(session, batch_id=batch.id)
    return BatchObject.of(
        batch,
        cost=batch_cost_json(session, batch, settings),
        goodput=None if goodput is None else goodput.to_json(object_name="batch.goodput"),
        usage=batch_usages(session, batch_ids=[batch.id])[batch.id],
        retries=retry_ids_of(session, batch_ids=[batch.id])[batch.id],
    )


@router.get("", response_model=BatchList)
def list_all(
    session: DbSession,
    caller: Caller,
    after: Cursor = None,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
) -> BatchList:
    """The caller's batches, newest first, paginated with `after` and `limit`."""
    rows = list_batches(session, tenant_id=caller.tenant_id, after=after, limit=limit)
    usages = batch_usages(session, batch_ids=[row.id for row in rows[:limit]])
    retries = retry_ids_of(session, batch_ids=[row.id for row in rows[:limit]])
    page = [BatchObject.of(row, usage=usages[row.id], retries=retries[row.id]) for row in rows[:limit]]
    return BatchList(data=page, **cursor_fields(page, has_more=len(rows) > limit))


@router.post("/{batch_id}/cancel", response_model=BatchObject, responses=error_responses(409))
def cancel(batch_id: str, session: DbSession, caller: Caller) -> BatchObject:
    """Cancel a batch: queued requests end at once, running ones are aborted within seconds."""
    batch = cancel_batch(session, tenant_id=caller.tenant_id, batch_id=batch_id)
    return BatchObject.of(batch, usage=batch_usages(session, batch_ids=[batch.id])[batch.id])


@router.post("/{batch_id}/pause", response_model=BatchObject, responses=error_responses(409))
def pause(batch_id: str, session: DbSession, caller: Caller) -> BatchObject:
    """Pause a batch (a Backfill extension): no new claims, running requests handed back within seconds.

    The status stays `in_progress` and `paused_at` is set; the completion window keeps running, so a paused
    batch can still expire. Idempotent; cancel works while paused; 409 once the batch has ended."""
    batch = pause_batch(session, tenant_id=caller.tenant_id, batch_id=batch_id)
    return BatchObject.of(batch, usage=batch_usages(session, batch_ids=[batch.id])[batch.id])


@router.post("/{batch_id}/resume", response_model=BatchObject, responses=error_responses(409))
def resume(batch_id: str, session: DbSession, caller: Caller) -> BatchObject:
    """Resume a paused batch (a Backfill extension): its requests are claimed again. Idempotent while the batch
    runs; 409 once it has ended (or is ending), paused or not."""
    batch = resume_batch(session, tenant_id=caller.tenant_id, batch_id=batch_id)
    return BatchObject.of(batch, usage=batch_usages(session, batch_ids=[batch.id])[batch.id])


@router.post("/{batch_id}/priority", response_model=BatchObject, responses=error_responses(409))
def prioritise(batch_id: str, body: BatchPriority, session: DbSession, caller: Caller, settings: Config) -> BatchObject:
    """Change a running batch's priority (a Backfill extension, -100..100, capped per tenant by the operator).

    Claim order: requests urgent by deadline first, then higher priority, then a fair share across tenants."""
    batch = set_priority(session, settings, tenant_id=caller.tenant_id, batch_id=batch_id, priority=body.priority)
    return BatchObject.of(batch, usage=batch_usages(session, batch_ids=[batch.id])[batch.id])
