"""Backfill extensions on batches: retry what failed keeping what succeeded, and results while a batch runs."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query
from fastapi.responses import StreamingResponse

from api.deps import Caller, Config, DbSession
from api.errors import error_responses
from api.openai.schemas import BatchObject, BatchRetry
from storage.batches.results import merged_results, results_so_far
from storage.batches.retries import retry_batch
from storage.errors import InvalidRequest
from storage.finance.budgets import check_month_not_spent
from storage.protocols import OPENAI
from storage.queue.batch_rows import queued_models
from storage.queue.usage import batch_usages
from storage.wakeups import wake_after_commit

router = APIRouter(prefix="/v1/batches", tags=["batches"])

_RESULTS_DOC = {
    "200": {
        "description": "JSONL result lines; `X-Incomplete: true` while the batch has not ended, `X-Next-After` "
        "the cursor for what finishes next.",
        "content": {"application/x-jsonl": {"schema": {"type": "string"}}},
    }
}


@router.post("/{batch_id}/retry", response_model=BatchObject, responses=error_responses(409))
def retry(
    batch_id: str, session: DbSession, caller: Caller, settings: Config, body: BatchRetry | None = None
) -> BatchObject:
    """Backfill extension: a new batch re-running only the requests of this ended batch (and its retries)
    whose latest attempt is an error line of a retryable kind (batch_expired, batch_cancelled,
    budget_exceeded, server errors; client errors only when named in `codes`). Successes are never run or
    billed again. 409 while the batch or one of its retries still runs; 400 `nothing_to_retry`."""
    codes = body.codes if body is not None else []
    check_month_not_spent(session, settings, tenant_id=caller.tenant_id, what="a retry")
    batch = retry_batch(session, tenant_id=caller.tenant_id, batch_id=batch_id, protocol=OPENAI, codes=codes)
    for model in queued_models(session, batch_id=batch.id):
        wake_after_commit(session, "batch.run", model=model)
    return BatchObject.of(batch, usage=batch_usages(session, batch_ids=[batch.id])[batch.id], retries=[])


@router.get("/{batch_id}/results", response_class=StreamingResponse, responses=_RESULTS_DOC)  # type: ignore[arg-type]
def results(
    batch_id: str,
    session: DbSession,
    caller: Caller,
    after: Annotated[str | None, Query(max_length=32, description="The X-Next-After of a previous answer.")] = None,
    merged: bool = False,
) -> StreamingResponse:
    """Backfill extension: the result lines recorded so far (output and error lines in the batch's line
    format, each request at most once), also while the batch runs. `after` returns only what finished since
    that answer. `merged=true`: every request once over the batch and all its retries, the latest attempt
    winning. A Message Batch's id works too (lines in Anthropic's format)."""
    if merged and after is not None:
        raise InvalidRequest("`after` does not apply to the merged view.", param="after")
    if merged:
        view = merged_results(session, tenant_id=caller.tenant_id, batch_id=batch_id)
    else:
        view = results_so_far(session, tenant_id=caller.tenant_id, batch_id=batch_id, after=after)
    headers = {"X-Incomplete": "true" if view.incomplete else "false"}
    if view.next_after is not None:
        headers["X-Next-After"] = view.next_after
    return StreamingResponse(view.lines, media_type="application/x-jsonl", headers=headers)
