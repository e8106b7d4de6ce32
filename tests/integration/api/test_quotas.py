"""Operator-set per-tenant quotas on files, stored bytes and open batches: refused with a clear 429 in the
caller's protocol's envelope, before anything is stored or queued."""

from __future__ import annotations

import json
from collections.abc import Iterator

import anthropic
import openai
import pytest

from tests.conftest import Backend, LiveServer, make_key, start_server
from tests.integration.api.conftest import FAKE_MODELS
from tests.integration.api.helpers import chat_line, to_jsonl, upload

ENV = {
    "BACKFILL_MODELS": FAKE_MODELS,
    "BACKFILL_TENANT_MAX_FILES": "3",
    "BACKFILL_TENANT_MAX_STORED_BYTES": "2000",
    "BACKFILL_TENANT_MAX_OPEN_BATCHES": "1",
    "BACKFILL_TENANT_QUOTAS": json.dumps({"bigco": {"max_files": 5, "max_open_batches": 3}}),
}
pytestmark = pytest.mark.backfill_env(ENV)


@pytest.fixture
def api(backend: Backend) -> Iterator[LiveServer]:
    server, stop = start_server(with_worker=False)  # no worker: batches stay open
    yield server
    stop()


def test_uploads_past_the_file_count_or_stored_bytes_quota_are_refused_with_a_429(api: LiveServer) -> None:
    client = api.client(make_key("acme"))
    small = to_jsonl([chat_line(0)])
    kept = [upload(client, small) for _ in range(3)]
    with pytest.raises(openai.RateLimitError) as refused:
        upload(client, small)
    error = refused.value.body
    assert isinstance(error, dict) and error["code"] == "quota_exceeded" and error["param"] == "file"
    assert "3 files" in error["message"] and "BACKFILL_TENANT_MAX_FILES" not in error["message"]
    assert len(client.files.list().data) == 3

    client.files.delete(kept[0].id)  # deleting frees the room
    too_big = to_jsonl([chat_line(i) for i in range(30)])
    assert len(too_big) + 2 * len(small) > 2000
    with pytest.raises(openai.RateLimitError, match="2000 bytes"):
        upload(client, too_big)
    assert len(client.files.list().data) == 2  # nothing of the refused upload stays


def test_open_batches_past_the_quota_are_refused_on_both_protocols_and_an_override_lifts_it(
    api: LiveServer,
) -> None:
    key = make_key("acme")
    client = api.client(key)
    source = upload(client, to_jsonl([chat_line(0)]))
    client.batches.create(input_file_id=source.id, endpoint="/v1/chat/completions", completion_window="24h")
    with pytest.raises(openai.RateLimitError, match="1 open batch") as refused:
        client.batches.create(input_file_id=source.id, endpoint="/v1/chat/completions", completion_window="24h")
    assert isinstance(refused.value.body, dict) and refused.value.body["code"] == "quota_exceeded"
    messages = anthropic.Anthropic(api_key=key, base_url=api.base_url, max_retries=0)
    request = {"model": "fake-model", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}
    with pytest.raises(anthropic.RateLimitError, match="1 open batch"):
        messages.messages.batches.create(requests=[{"custom_id": "a", "params": request}])  # type: ignore[list-item]
    assert len(client.batches.list().data) == 1

    big = api.client(make_key("bigco"))
    source = upload(big, to_jsonl([chat_line(0)]))
    for _ in range(3):
        big.batches.create(input_file_id=source.id, endpoint="/v1/chat/completions", completion_window="24h")
    with pytest.raises(openai.RateLimitError, match="3 open batches"):
        big.batches.create(input_file_id=source.id, endpoint="/v1/chat/completions", completion_window="24h")
