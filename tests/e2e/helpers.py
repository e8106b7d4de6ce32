"""Helpers for end-to-end tests that drive the worker directly: batch lines in, files out."""

from __future__ import annotations

import json
from typing import Any


def batch_line(i: int, max_tokens: int = 32) -> dict[str, Any]:
    body = {
        "model": "backfill-demo",
        "messages": [{"role": "user", "content": f"Write function number {i}."}],
        "max_tokens": max_tokens,
        "ignore_eos": True,
    }
    return {"custom_id": f"b{i}", "method": "POST", "url": "/v1/chat/completions", "body": body}


def submit(lines: list[dict[str, Any]]) -> str:
    """Upload, create and ingest a batch through the storage layer, as the API and the io worker do."""
    from storage.batches import create_batch
    from storage.blobs import get_blob_store
    from storage.db import transaction
    from storage.files import create_file
    from storage.settings import get_settings
    from storage.tenants import get_or_create_tenant
    from worker.ingest import ingest_batch

    data = b"".join(json.dumps(line).encode() + b"\n" for line in lines)
    with transaction() as session:
        tenant = get_or_create_tenant(session, name="acme")
        source = create_file(
            session, get_blob_store(), tenant_id=tenant.id, filename="in.jsonl", purpose="batch", chunks=[data]
        )
        batch = create_batch(
            session,
            tenant_id=tenant.id,
            input_file_id=source.id,
            endpoint="/v1/chat/completions",
            completion_window="24h",
            model="backfill-demo",
            metadata=None,
        )
    with transaction() as session:
        ingest_batch(session, get_blob_store(), get_settings(), batch_id=batch.id)
    return batch.id


def read_file(file_id: str | None) -> list[dict[str, Any]]:
    from storage.blobs import get_blob_store

    if file_id is None:
        return []
    data = b"".join(get_blob_store().open_stream(f"files/{file_id}"))
    return [json.loads(line) for line in data.splitlines()]
