"""Backfill extension on Message Batches: retry what failed, keeping what succeeded."""

from __future__ import annotations

from fastapi import APIRouter, Request

from api.anthropic.deps import Caller
from api.anthropic.schemas import MessageBatch
from api.deps import Config, DbSession
from api.openai.schemas import BatchRetry
from storage.batches.retries import RetryChoices, retry_batch
from storage.finance.budgets import check_month_not_spent
from storage.protocols import ANTHROPIC
from storage.queue.batch_rows import queued_models
from storage.wakeups import wake_after_commit

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
    check_month_not_spent(session, settings, tenant_id=caller.tenant_id, what="a retry")
    batch = retry_batch(
        session, settings, tenant_id=caller.tenant_id, batch_id=message_batch_id, protocol=ANTHROPIC, choices=choices
    )
    for model in queued_models(session, batch_id=batch.id):
        wake_after_commit(session, "batch.run", model=model)
    return MessageBatch.of(batch, base_url=str(request.base_url), retries=[])
