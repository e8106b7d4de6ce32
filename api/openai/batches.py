"""Batches: create from an uploaded file, read, list, cancel."""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Annotated, Any

from fastapi import APIRouter, Query
from fastapi.concurrency import run_in_threadpool
from sqlalchemy.orm import Session

from api.deps import Blobs, Caller, Config, Cursor, DbSession
from api.errors import error_responses
from api.fair_share import LONG_POLLS_PER_TENANT
from api.openai.schemas import BatchCreate, BatchList, BatchObject, BatchPriority
from api.paging import cursor_fields
from storage.batch_endings import endings, waiting
from storage.batches.batches import get_batch, list_batches
from storage.batches.control import cancel_batch, pause_batch, resume_batch, set_priority
from storage.batches.creation import create_from_file, estimate_file
from storage.batches.retries import retry_ids_of
from storage.db import transaction
from storage.finance.goodput import batch_goodput
from storage.finance.job_cost import batch_cost_json
from storage.lifecycle import TERMINAL
from storage.protocols import OPENAI
from storage.queue.usage import batch_usages
from storage.settings import Settings, get_settings

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


WAIT_MAX_SECONDS = 60.0  # one long-poll at most; a client waits longer by asking again
WAITS_PER_TENANT = LONG_POLLS_PER_TENANT  # a tenant's long-polls waiting at once in one API process (their own
# fair-share slots: api/fair_share.py); past it, answered at once
WAITS_PER_PROCESS = 1_000
LOOK_SECONDS = 0.5  # how often a waiter reads the status, for endings another process commits (Celery workers)
_waits: dict[str, int] = {}


@router.get("/{batch_id}", response_model=BatchObject)
def retrieve(batch_id: str, session: DbSession, caller: Caller, settings: Config) -> BatchObject:
    """One batch, with live request counts and (Backfill extensions) its cost block and goodput."""
    return _batch_object(session, settings, tenant_id=caller.tenant_id, batch_id=batch_id)


@router.get("/{batch_id}/wait", response_model=BatchObject)
async def wait(
    batch_id: str, caller: Caller, timeout: Annotated[float, Query(ge=0, le=WAIT_MAX_SECONDS)] = 10.0
) -> BatchObject:
    """A long-poll (a Backfill extension): the batch as `GET /v1/batches/{id}` gives it, once it has ended
    (completed, failed, expired, cancelled) or after `timeout` seconds (at most 60), whichever comes first. The CLI
    watches batches with it, so it sees an end the moment it commits rather than at its next poll. No connection
    or thread is held while waiting; past 16 waits of one tenant in one API process the answer comes at once."""
    tenant = caller.tenant_id
    until = time.monotonic() + timeout
    if timeout > 0 and _waits.get(tenant, 0) < WAITS_PER_TENANT and waiting() < WAITS_PER_PROCESS:
        _waits[tenant] = _waits.get(tenant, 0) + 1  # the event loop's thread only: no lock needed
        try:
            async with endings() as ended:
                while (left := until - time.monotonic()) > 0:
                    ended.clear()  # before the read: an end committed meanwhile still wakes the wait below
                    if await run_in_threadpool(_status, tenant, batch_id) in TERMINAL:
                        break
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(ended.wait(), min(left, LOOK_SECONDS))
        finally:
            _waits[tenant] -= 1
            if not _waits[tenant]:
                del _waits[tenant]
    return await run_in_threadpool(_retrieved, tenant, batch_id)


def _status(tenant_id: str, batch_id: str) -> str:
    with transaction() as session:
        return get_batch(session, tenant_id=tenant_id, batch_id=batch_id, protocol=OPENAI).status


def _retrieved(tenant_id: str, batch_id: str) -> BatchObject:
    with transaction() as session:
        return _batch_object(session, get_settings(), tenant_id=tenant_id, batch_id=batch_id)


def _batch_object(session: Session, settings: Settings, *, tenant_id: str, batch_id: str) -> BatchObject:
    batch = get_batch(session, tenant_id=tenant_id, batch_id=batch_id, protocol=OPENAI)
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
