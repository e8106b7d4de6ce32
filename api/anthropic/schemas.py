"""Anthropic's Message Batch shapes, as its SDK types them (`anthropic.types.messages`); `MessageBatch.of` renders
a batch row through the status view (api/anthropic/status.py)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from api.anthropic.status import ended_at, processing_status, request_counts
from storage.batches.batches import batch_errors
from storage.batches.trials import trial_json
from storage.finance.budgets import usd, usd_text
from storage.models import Batch
from storage.strict import Priority


def rfc3339(at: int | None) -> str | None:
    """Unix seconds as Anthropic's RFC 3339 UTC string, e.g. 2024-08-20T18:37:24Z."""
    if at is None:
        return None
    return datetime.fromtimestamp(at, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class MessageBatchRequestCounts(BaseModel):
    processing: int
    succeeded: int
    errored: int
    canceled: int
    expired: int


class MessageBatch(BaseModel):
    id: str
    type: Literal["message_batch"] = "message_batch"
    processing_status: Literal["in_progress", "canceling", "ended"]
    request_counts: MessageBatchRequestCounts
    created_at: str
    expires_at: str
    ended_at: str | None = None
    cancel_initiated_at: str | None = None
    archived_at: str | None = None
    results_url: str | None = None
    cost: dict[str, Any] | None = Field(default=None, description="Backfill extension: the job's cost block.")
    goodput: dict[str, Any] | None = Field(
        default=None, description="Backfill extension: requests completed before the deadline / accepted."
    )
    warnings: dict[str, Any] | None = Field(
        default=None, description="Backfill extension: admission warnings (e.g. `deadline_at_risk`)."
    )
    retry_of: str | None = Field(
        default=None, description="Backfill extension: the ended batch whose failed requests this batch re-runs."
    )
    retries: list[str] | None = Field(
        default=None, description="Backfill extension: the ids of this batch's retries, oldest first."
    )
    priority: int = Field(default=0, description="Backfill extension: the batch's claim priority (-100..100).")
    paused_at: str | None = Field(
        default=None, description="Backfill extension: set while paused (`processing_status` stays `in_progress`)."
    )
    max_cost_usd: str | None = Field(default=None, description="Backfill extension: the batch's spend cap, if any.")
    completion_window: str = Field(
        default="24h",
        description="Backfill extension: the batch's completion window (`expires_at` follows it; `background`: no "
        "deadline, `expires_at` 9999-12-31T23:59:59Z).",
    )
    on_expiry: str | None = Field(
        default=None, description="Backfill extension: `continue_in_background`, or null (cut short at expiry)."
    )
    trial: dict[str, Any] | None = Field(
        default=None,
        description="Backfill extension (docs/workflow.md): the trial asked for, its status and, once run, its report.",
    )
    checks: dict[str, Any] | None = Field(
        default=None, description="Backfill extension (docs/workflow.md): what every answer must pass."
    )

    @classmethod
    def of(
        cls,
        row: Batch,
        *,
        base_url: str,
        cost: dict[str, Any] | None = None,
        goodput: dict[str, Any] | None = None,
        retries: list[str] | None = None,
    ) -> MessageBatch:
        """The batch row as Anthropic's `MessageBatch`, with its live request counts."""
        status = processing_status(row)
        results = f"{base_url.rstrip('/')}/v1/messages/batches/{row.id}/results" if status == "ended" else None
        return cls(
            id=row.id,
            processing_status=status,
            request_counts=MessageBatchRequestCounts(**vars(request_counts(row))),
            created_at=rfc3339(row.created_at) or "",
            expires_at=rfc3339(row.expires_at) or "",  # background: 9999-12-31T23:59:59Z (docs/anthropic.md)
            ended_at=rfc3339(ended_at(row)),
            cancel_initiated_at=rfc3339(row.cancelling_at),
            archived_at=rfc3339(row.archived_at),
            results_url=results,
            cost=cost,
            goodput=goodput,
            warnings=batch_errors(row.warnings),
            retry_of=row.retry_of,
            retries=retries,
            priority=row.priority,
            paused_at=rfc3339(row.paused_at),
            max_cost_usd=None if row.max_cost_micro_usd is None else usd_text(usd(row.max_cost_micro_usd)),
            completion_window=row.completion_window,
            on_expiry=row.on_expiry,
            trial=trial_json(row),
            checks=row.checks,
        )


class MessageBatchPriority(BaseModel):
    """The body of `POST /v1/messages/batches/{id}/priority` (a Backfill extension)."""

    model_config = ConfigDict(extra="forbid")

    priority: Priority


class MessageBatchList(BaseModel):
    data: list[MessageBatch]
    has_more: bool
    first_id: str | None = None
    last_id: str | None = None


class DeletedMessageBatch(BaseModel):
    id: str
    type: Literal["message_batch_deleted"] = "message_batch_deleted"
