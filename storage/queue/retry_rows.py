"""Queue rows of a retry: copies of an ended batch's failed requests, queued again under the retry's batch."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from storage.batches import lifecycle
from storage.ids import IdPool
from storage.models import Batch, BatchRequest
from storage.queue.enqueue import insert_rows

_ROW_IDS = IdPool("batch_req_")


def requeue_copies(session: Session, *, batch: Batch, request_ids: list[str]) -> int:
    """Queue a copy of each of these finished requests under `batch` (same line, custom_id and body; the
    batch's deadline; no result); return how many."""
    if not request_ids:
        return 0
    sources = session.execute(
        select(
            BatchRequest.line,
            BatchRequest.custom_id,
            BatchRequest.model,
            BatchRequest.url,
            BatchRequest.body,
            BatchRequest.prefix_key,
            BatchRequest.est_input_tokens,
            BatchRequest.max_output_tokens,
        ).where(BatchRequest.id.in_(request_ids))
    ).all()
    rows: list[dict[str, Any]] = [
        {
            "id": _ROW_IDS.next(),
            "batch_id": batch.id,
            "tenant_id": batch.tenant_id,
            "line": line,
            "custom_id": custom_id,
            "model": model,
            "url": url,
            "body": body,
            "status": lifecycle.REQ_INITIAL,
            "deadline": batch.expires_at,
            "prefix_key": prefix_key,
            "est_input_tokens": est_input,
            "max_output_tokens": max_output,
            "attempts": 0,
            "prompt_tokens": 0,
            "completion_tokens": 0,
            "engine_seconds": 0.0,
        }
        for line, custom_id, model, url, body, prefix_key, est_input, max_output in sources
    ]
    insert_rows(session, rows)
    return len(rows)
