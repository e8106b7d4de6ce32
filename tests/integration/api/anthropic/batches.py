"""What the Anthropic Message Batches tests share: the price book and settings, the SDK client, line and
result helpers, and the error-envelope check."""

from __future__ import annotations

import json
import time
from typing import Any

import anthropic
import httpx
from anthropic.types.messages import MessageBatch

from tests.conftest import LiveServer
from tests.integration.api.conftest import FAKE_MODELS

PRICES = {
    "prices": [
        {"model": "fake-model", "effective_from": "2025-01-01", "input_usd_per_mtok": "1", "output_usd_per_mtok": "4"},
        {
            "model": "other-model",
            "effective_from": "2025-01-01",
            "input_usd_per_mtok": "10",
            "output_usd_per_mtok": "40",
        },
    ]
}
ENV = {
    "BACKFILL_MODELS": FAKE_MODELS,
    "BACKFILL_PRICE_BOOK": json.dumps(PRICES),
    "BACKFILL_MESSAGE_BATCH_MAX_BYTES": str(64 * 1024),
    "BACKFILL_REAP_INTERVAL_SECONDS": "1",
}


def client_for(api: LiveServer, key: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(api_key=key, base_url=api.base_url, max_retries=0, timeout=60)


def req(custom_id: str, model: str = "fake-model", max_tokens: int = 4, **params: Any) -> dict[str, Any]:
    body = {"model": model, "max_tokens": max_tokens, "messages": [{"role": "user", "content": f"hello {custom_id}"}]}
    return {"custom_id": custom_id, "params": {**body, **params}}


def counted(batch: MessageBatch) -> int:
    c = batch.request_counts
    return c.processing + c.succeeded + c.errored + c.canceled + c.expired


def wait_ended(client: anthropic.Anthropic, batch_id: str, timeout: float = 60) -> MessageBatch:
    deadline = time.time() + timeout
    while time.time() < deadline:
        batch = client.messages.batches.retrieve(batch_id)
        if batch.processing_status == "ended":
            return batch
        time.sleep(0.1)
    raise AssertionError(f"batch {batch_id} stuck in {batch.processing_status}")


def results(client: anthropic.Anthropic, batch_id: str) -> dict[str, Any]:
    return {line.custom_id: line.result for line in client.messages.batches.results(batch_id)}


def stored_manifest(batch_id: str) -> dict[str, Any]:
    """The batch's manifest.json as someone reading the bucket sees it."""
    from storage.db import transaction
    from storage.files.blobs import get_blob_store
    from storage.models import Batch

    with transaction() as session:
        key = session.get(Batch, batch_id).manifest_key  # type: ignore[union-attr]
    assert key is not None
    data: dict[str, Any] = json.loads(b"".join(get_blob_store().open_stream(key, chunk_bytes=1 << 16)))
    return data


def raw(api: LiveServer, method: str, path: str, **kwargs: Any) -> httpx.Response:
    return httpx.request(method, f"{api.base_url}{path}", timeout=30, **kwargs)


def assert_envelope(response: httpx.Response, status: int, kind: str, says: str = "") -> None:
    assert response.status_code == status, response.text
    body = response.json()
    assert body["type"] == "error" and body["error"]["type"] == kind and says in body["error"]["message"], body
