"""Small builders for JSONL jobs and waiting on batches (plain functions)."""

from __future__ import annotations

import io
import json
import time
from typing import Any

TERMINAL = {"completed", "failed", "expired", "cancelled"}


def chat_line(i: int, *, model: str = "fake-model", max_tokens: int = 4, **extra: Any) -> dict[str, Any]:
    body = {"model": model, "messages": [{"role": "user", "content": f"hello {i}"}], "max_tokens": max_tokens}
    return {"custom_id": f"req-{i}", "method": "POST", "url": "/v1/chat/completions", "body": {**body, **extra}}


def to_jsonl(lines: list[Any]) -> bytes:
    return b"".join(json.dumps(line).encode() + b"\n" for line in lines)


def upload(client: Any, data: bytes, name: str = "jobs.jsonl") -> Any:
    return client.files.create(file=(name, io.BytesIO(data)), purpose="batch")


def wait_for(client: Any, batch_id: str, statuses: set[str] = TERMINAL, timeout: float = 120) -> Any:
    deadline = time.time() + timeout
    while time.time() < deadline:
        batch = client.batches.retrieve(batch_id)
        if batch.status in statuses:
            return batch
        time.sleep(0.1)
    raise AssertionError(f"batch {batch_id} stuck in {batch.status}")


def read_lines(client: Any, file_id: str | None) -> list[dict[str, Any]]:
    if file_id is None:
        return []
    return [json.loads(line) for line in client.files.content(file_id).text.splitlines()]
