"""Submitting jobs through the real storage path (file upload, batch row, ingest), for queue tests."""

from __future__ import annotations

import json
from typing import Any

from storage.batches.batches import create_batch
from storage.db import transaction
from storage.files.blobs import get_blob_store
from storage.files.files import create_file
from storage.settings import Settings, get_settings
from storage.tenants import get_or_create_tenant
from worker.jobs.ingest import ingest_batch


def chat(i: int, system: str | None = None, *, max_tokens: int = 4, model: str = "fake-model") -> dict[str, Any]:
    """A chat line, optionally led by a system prompt."""
    messages = [{"role": "system", "content": system}] if system is not None else []
    messages.append({"role": "user", "content": f"question {i}"})
    body = {"model": model, "messages": messages, "max_tokens": max_tokens}
    return {"custom_id": f"r{i}", "method": "POST", "url": "/v1/chat/completions", "body": body}


def submit_job(
    lines: list[dict[str, Any]],
    *,
    tenant: str = "acme",
    deadline: int | None = None,
    completion_window: str = "24h",
    settings: Settings | None = None,
) -> tuple[str, str]:
    """Upload, create and ingest a batch (its deadline overridden if given); return (batch id, status)."""
    batch_id = create_job(lines, tenant=tenant, deadline=deadline, completion_window=completion_window)
    with transaction() as session:
        status = ingest_batch(session, get_blob_store(), settings or get_settings(), batch_id=batch_id)
    return batch_id, status


def create_job(
    lines: list[dict[str, Any]], *, tenant: str = "acme", deadline: int | None = None, completion_window: str = "24h"
) -> str:
    """Upload the lines and create a `validating` batch for them (not ingested yet); return its id."""
    data = b"".join(json.dumps(line).encode() + b"\n" for line in lines)
    with transaction() as session:
        owner = get_or_create_tenant(session, name=tenant)
        source = create_file(
            session, get_blob_store(), tenant_id=owner.id, filename="job.jsonl", purpose="batch", chunks=[data]
        )
        batch = create_batch(
            session,
            tenant_id=owner.id,
            input_file_id=source.id,
            endpoint="/v1/chat/completions",
            completion_window=completion_window,
            model=lines[0]["body"]["model"],
            metadata=None,
        )
        if deadline is not None:
            batch.expires_at = deadline
    return batch.id
