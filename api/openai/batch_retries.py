"""Backfill extensions on batches: retry what failed keeping what succeeded, and results while a batch runs."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Header, Query
from fastapi.responses import Response, StreamingResponse

from api.deps import Caller, Config, DbSession
from api.errors import error_responses
from api.openai.schemas import BatchObject, BatchRetry
from storage.batches.results import merged_results, results_so_far
from storage.batches.retries import RetryChoices, retry_batch
from storage.errors import InvalidRequest
from storage.protocols import OPENAI
from storage.queue.usage import batch_usages

router = APIRouter(prefix="/v1/batches", tags=["batches"])
RESULTS_LIMIT_MAX = 100_000  # lines in one results answer (a Message Batch holds up to 100,000)

_RESULTS_DOC = {
    "200": {
        "description": "JSONL result lines; `X-Incomplete: true` while the batch has not ended, `X-Next-After` "
        "the cursor for what finishes next, `X-Has-More: true` when `limit` left lines out, `ETag` the answer's "
        "version.",
        "content": {"application/x-jsonl": {"schema": {"type": "string"}}},
    },
    "304": {"description": "`If-None-Match` named the answer's ETag: the batch has not moved since (no body)."},
}


@router.post("/{batch_id}/retry", response_model=BatchObject, responses=error_responses(409))
def retry(
    batch_id: str, session: DbSession, caller: Caller, settings: Config, body: BatchRetry | None = None
) -> BatchObject:
    """Backfill extension: a new batch re-running only the requests of this ended batch (and its retries)
    whose latest attempt is an error line of a retryable kind (batch_expired, batch_cancelled,
    budget_exceeded, server errors; client errors only when named in `codes`). Successes are never run or
    billed again. 409 while the batch or one of its retries still runs; 400 `nothing_to_retry`."""
    choices = body.choices() if body is not None else RetryChoices()
    batch = retry_batch(
        session, settings, tenant_id=caller.tenant_id, batch_id=batch_id, protocol=OPENAI, choices=choices
    )
    return BatchObject.of(batch, usage=batch_usages(session, batch_ids=[batch.id])[batch.id], retries=[])


@router.get("/{batch_id}/results", response_class=StreamingResponse, responses=_RESULTS_DOC)  # type: ignore[arg-type]
def results(
    batch_id: str,
    session: DbSession,
    caller: Caller,
    after: Annotated[str | None, Query(max_length=32, description="The X-Next-After of a previous answer.")] = None,
    merged: bool = False,
    limit: Annotated[
        int | None, Query(ge=1, le=RESULTS_LIMIT_MAX, description="At most this many lines (all without it).")
    ] = None,
    if_none_match: Annotated[str | None, Header(max_length=1024)] = None,
) -> Response:
    """Backfill extension: the result lines recorded so far (output and error lines in the batch's line
    format, each request at most once), also while the batch runs. `after` returns only what finished since
    that answer; `limit` at most that many lines (`X-Has-More: true` when more are ready past `X-Next-After`).
    The answer's `ETag` changes whenever it may: with `If-None-Match`, a batch that has not moved answers 304
    with no body. `merged=true`: every request once over the batch and all its retries, the latest attempt
    winning. A batch of another protocol works too (lines in its protocol's format)."""
    if merged and after is not None:
        raise InvalidRequest("`after` does not apply to the merged view.", param="after")
    if merged:
        view = merged_results(session, tenant_id=caller.tenant_id, batch_id=batch_id, limit=limit)
    else:
        known = _entity_tags(if_none_match)
        view = results_so_far(
            session, tenant_id=caller.tenant_id, batch_id=batch_id, after=after, limit=limit, known=known
        )
    headers = {"X-Incomplete": "true" if view.incomplete else "false"}
    if view.version is not None:
        headers["ETag"] = f'W/"{view.version}"'
    if view.not_modified:
        return Response(status_code=304, headers=headers)
    if view.next_after is not None:
        headers["X-Next-After"] = view.next_after
        headers["X-Has-More"] = "true" if view.has_more else "false"
    return StreamingResponse(view.lines, media_type="application/x-jsonl", headers=headers)


def lines_path(batch_id: str) -> str:
    """Where `results` serves a batch's lines a page at a time (any protocol's batch, in its own line format)."""
    return f"{router.prefix}/{batch_id}/results"


def _entity_tags(header: str | None) -> frozenset[str]:
    """The opaque tags an If-None-Match lists, weak or strong (a GET compares them weakly); `*` matches none:
    a caller that holds no answer gets one."""
    if header is None:
        return frozenset()
    return frozenset(part.strip().removeprefix("W/").strip('"') for part in header.split(",")) - {"", "*"}
