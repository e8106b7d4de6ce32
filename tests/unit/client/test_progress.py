"""The CLI follows a batch with long-polls where the server has them, and polls where it does not (OpenAI)."""

from __future__ import annotations

import json
import time

import httpx
import openai
import pytest
from openai.types import Batch

from client import progress

BATCH = {
    "id": "batch_1",
    "object": "batch",
    "endpoint": "/v1/chat/completions",
    "input_file_id": "file-1",
    "completion_window": "24h",
    "created_at": 1,
    "request_counts": {"total": 2, "completed": 0, "failed": 0},
}


def client_of(handler: httpx.MockTransport) -> openai.OpenAI:
    return openai.OpenAI(api_key="k", base_url="http://test/v1", http_client=httpx.Client(transport=handler))


def test_each_look_is_one_long_poll_and_the_end_is_seen_without_sleeping(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[str] = []
    statuses = iter(["in_progress", "completed"])

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(f"{request.url.path}?{request.url.query.decode()}")
        return httpx.Response(200, json={**BATCH, "status": next(statuses)})

    monkeypatch.setattr(time, "sleep", lambda seconds: pytest.fail("a long-poll needs no sleep"))
    start = Batch.model_validate({**BATCH, "status": "validating"})
    ended = progress.watch(client_of(httpx.MockTransport(answer)), start, poll_seconds=2.5)
    assert ended.status == "completed"
    assert seen == ["/v1/batches/batch_1/wait?timeout=2.5"] * 2


def test_a_server_without_long_polls_is_polled_and_asked_only_once(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[str] = []
    statuses = iter(["in_progress", "completed"])
    slept: list[float] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request.url.path)
        if request.url.path.endswith("/wait"):
            return httpx.Response(404, json={"error": {"message": "Not found", "type": "invalid_request_error"}})
        return httpx.Response(200, content=json.dumps({**BATCH, "status": next(statuses)}))

    monkeypatch.setattr(time, "sleep", slept.append)
    start = Batch.model_validate({**BATCH, "status": "validating"})
    ended = progress.watch(client_of(httpx.MockTransport(answer)), start, poll_seconds=1.0)
    assert ended.status == "completed"
    assert seen == ["/v1/batches/batch_1/wait", "/v1/batches/batch_1", "/v1/batches/batch_1"]
    assert slept == [1.0, 1.0]
