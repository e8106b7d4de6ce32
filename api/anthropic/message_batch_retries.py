"""Backfill extension on Message Batches: retry what failed, keeping what succeeded."""

from __future__ import annotations

from fastapi import APIRouter, Request

from api.anthropic.deps import Caller
from api.anthropic.schemas import MessageBatch
from api.deps import Config, DbSession
from api.openai.schemas import BatchRetry
from storage.batches.retries import RetryChoices, retry_batch
from storage.protocols import ANTHROPIC

router = APIRouter(prefix="/v1/messages/batches", tags=["message batches"])


@router.post("/{message_batch_id}/retry", response_model=MessageBatch)
def retry(
    message_batch_id: str,
    request: Request,
    session: DbSession,
    caller: Caller,
    settings: Config,
    body: BatchRetry | None = None,
) -> MessageBatch:
    """Backfill extension: a new Message Batch re-running only the requests of this ended batch (and its
    retries) whose latest result is `expired`, `canceled` or a server error (`errored` client errors only
    when their code is named in `codes`). Succeeded requests are never run or billed again. 409 while the
    batch or one of its retries is still processing."""
    choices = body.choices() if body is not None else RetryChoices()
    batch = retry_batch(
        session, settings, tenant_id=caller.tenant_id, batch_id=message_batch_id, protocol=ANTHROPIC, choices=choices
    )
    return MessageBatch.of(batch, base_url=str(request.base_url), retries=[])
