"""Polling `GET /v1/batches/{id}/results` cheaply (a Backfill extension): `limit` returns only what the reader
shows, and a poll of a batch that has not moved since answers 304 with no body (its ETag)."""

from __future__ import annotations

import json
import time
from typing import Any

import httpx
import openai
import pytest

from tests.conftest import LiveServer, make_key
from tests.integration.api.conftest import FAKE_MODELS
from tests.integration.api.helpers import chat_line, to_jsonl, upload, wait_for

pytestmark = pytest.mark.backfill_env({"BACKFILL_MODELS": FAKE_MODELS})


def results(client: openai.OpenAI, batch_id: str, *, etag: str | None = None, **params: Any) -> httpx.Response:
    headers = {"Authorization": f"Bearer {client.api_key}"}
    if etag is not None:
        headers["If-None-Match"] = etag
    return httpx.get(f"{client.base_url}batches/{batch_id}/results", params=params, headers=headers, timeout=30)


def custom_ids(response: httpx.Response) -> list[str]:
    assert response.status_code == 200, response.text
    return [json.loads(line)["custom_id"] for line in response.text.splitlines()]


def test_a_limit_returns_that_many_lines_and_its_cursor_pages_through_the_rest_once(api: LiveServer) -> None:
    client = api.client(make_key("acme"))
    batch = client.batches.create(
        input_file_id=upload(client, to_jsonl([chat_line(i) for i in range(7)])).id,
        endpoint="/v1/chat/completions",
        completion_window="24h",
    )
    wait_for(client, batch.id)
    seen: list[str] = []
    pages: list[int] = []
    params: dict[str, Any] = {"limit": 3}
    while True:
        page = results(client, batch.id, **params)
        seen += custom_ids(page)
        pages.append(len(custom_ids(page)))
        if page.headers["X-Has-More"] == "false":
            break
        params = {"limit": 3, "after": page.headers["X-Next-After"]}
    assert pages == [3, 3, 1] and sorted(seen) == [f"req-{i}" for i in range(7)]  # each line once
    assert custom_ids(results(client, batch.id, limit=2, merged="true")) == ["req-0", "req-1"]
    for bad in (0, -1, 100_001, "ten"):
        refused = results(client, batch.id, limit=bad)
        assert refused.status_code == 400 and refused.json()["error"]["param"] == "limit"


def test_polling_a_batch_that_has_not_moved_answers_304_with_no_body(api: LiveServer) -> None:
    client = api.client(make_key("acme"))
    lines = [chat_line(i, max_tokens=2 if i < 3 else 10**8) for i in range(5)]  # 2 lines that never finish
    batch = client.batches.create(
        input_file_id=upload(client, to_jsonl(lines)).id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    while client.batches.retrieve(batch.id).request_counts.completed < 3:
        time.sleep(0.02)
    first = results(client, batch.id, limit=5)
    assert len(custom_ids(first)) == 3 and first.headers["X-Incomplete"] == "true"
    etag = first.headers["ETag"]
    again = results(client, batch.id, etag=etag, limit=5)
    assert again.status_code == 304 and again.content == b"" and again.headers["ETag"] == etag
    assert results(client, batch.id, etag=f'"other", {etag}', limit=5).status_code == 304  # a list of tags
    assert results(client, batch.id, etag=etag, limit=4).status_code == 200  # another question
    assert results(client, batch.id, etag=etag, limit=5, after=first.headers["X-Next-After"]).status_code == 200
    assert results(make_key_client(api, "globex"), batch.id, etag=etag, limit=5).status_code == 404

    client.batches.cancel(batch.id)  # the batch moves: the same question gets the new answer
    wait_for(client, batch.id)
    moved = results(client, batch.id, etag=etag, limit=5)
    assert len(custom_ids(moved)) == 5 and moved.headers["ETag"] != etag and moved.headers["X-Incomplete"] == "false"


def make_key_client(api: LiveServer, tenant: str) -> openai.OpenAI:
    return api.client(make_key(tenant))
