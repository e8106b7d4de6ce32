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
    from tests.integration.jobs import submit_job

    return submit_job(lines)[0]


def read_file(file_id: str | None) -> list[dict[str, Any]]:
    from storage.db import transaction
    from storage.files.blobs import get_blob_store
    from storage.models import File

    if file_id is None:
        return []
    with transaction() as session:
        row = session.get(File, file_id)
        assert row is not None, file_id
        key = row.blob_key  # the row keeps its key (storage/files/blobs/layout.py)
    data = b"".join(get_blob_store().open_stream(key))
    return [json.loads(line) for line in data.splitlines()]
