"""Long-polls (a Backfill extension): `GET /v1/batches/{id}/wait?timeout=S` answers the batch the moment it ends,
or after `timeout` seconds with it as it is; the CLI follows batches with it. It holds no thread or connection
while waiting, and has fair-share slots of its own, so a tenant's watchers never take its other requests' slots."""

from __future__ import annotations

import threading
import time
from typing import Any

import httpx
import openai
import pytest
from openai.types import Batch

from storage import batch_endings
from tests.conftest import LiveServer, make_key, start_server
from tests.integration.api.conftest import FAKE_MODELS
from tests.integration.api.helpers import chat_line, to_jsonl, upload, wait_for

pytestmark = pytest.mark.backfill_env({"BACKFILL_MODELS": FAKE_MODELS})


def waited(client: openai.OpenAI, batch_id: str, timeout: float) -> tuple[Batch, float]:
    began = time.monotonic()
    batch = client.get(f"/batches/{batch_id}/wait", cast_to=Batch, options={"params": {"timeout": timeout}})
    return batch, time.monotonic() - began


def create(client: openai.OpenAI, lines: list[dict[str, Any]]) -> Batch:
    source = upload(client, to_jsonl(lines))
    return client.batches.create(input_file_id=source.id, endpoint="/v1/chat/completions", completion_window="24h")


def test_a_wait_answers_when_the_batch_ends_not_at_its_timeout(api: LiveServer) -> None:
    client = api.client(make_key("acme"))
    batch = create(client, [chat_line(i) for i in range(6)])
    ended, seconds = waited(client, batch.id, 60)
    assert ended.status == "completed" and seconds < 60  # it ended; a timeout would have answered in_progress
    assert ended.request_counts is not None and ended.request_counts.completed == 6
    assert ended.output_file_id == client.batches.retrieve(batch.id).output_file_id
    again, _ = waited(client, batch.id, 60)  # an ended batch: answered at once, as retrieve answers
    assert again.status == "completed"


def test_a_wait_on_a_batch_still_running_answers_it_as_it_is_after_the_timeout(api: LiveServer) -> None:
    client = api.client(make_key("acme"))
    batch = create(client, [chat_line(0, max_tokens=10**8)])  # a line the fake engine never finishes
    running, seconds = waited(client, batch.id, 1.0)
    assert running.status in {"validating", "in_progress"} and seconds >= 1.0
    client.batches.cancel(batch.id)
    assert wait_for(client, batch.id).status == "cancelled"


def test_a_wait_is_bounded_and_sees_only_the_callers_batches(api: LiveServer) -> None:
    client = api.client(make_key("acme"))
    batch = create(client, [chat_line(0)])
    headers = {"Authorization": f"Bearer {make_key('globex')}"}
    stranger = httpx.get(f"{client.base_url}batches/{batch.id}/wait", params={"timeout": 5}, headers=headers)
    assert stranger.status_code == 404 and stranger.json()["error"]["param"] == "batch_id"
    for bad in (-1, 61, "soon"):
        refused = httpx.get(
            f"{client.base_url}batches/{batch.id}/wait",
            params={"timeout": bad},
            headers={"Authorization": f"Bearer {client.api_key}"},
        )
        assert refused.status_code == 400 and refused.json()["error"]["param"] == "timeout", refused.text
    missing = httpx.get(
        f"{client.base_url}batches/batch_nope/wait", headers={"Authorization": f"Bearer {client.api_key}"}
    )
    assert missing.status_code == 404
    wait_for(client, batch.id)


@pytest.mark.backfill_env({"BACKFILL_MODELS": FAKE_MODELS, "BACKFILL_TENANT_MAX_CONCURRENT_REQUESTS": "1"})
def test_a_tenants_waits_do_not_take_the_slots_of_its_other_requests(
    backend: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    server, stop = start_server(with_worker=True)
    try:
        client = server.client(make_key("acme")).with_options(max_retries=0)
        batch = create(client, [chat_line(0, max_tokens=10**8)])
        # Waits long enough to outlast a loaded machine's start-up of all three; the cancel below ends them at once.
        watchers = [threading.Thread(target=waited, args=(client, batch.id, 60.0)) for _ in range(3)]
        for watcher in watchers:
            watcher.start()
        deadline = time.monotonic() + 10
        while batch_endings.waiting() < 3 and time.monotonic() < deadline:  # the server runs in this process
            time.sleep(0.01)
        assert batch_endings.waiting() == 3
        listed = client.batches.list()  # the tenant's one slot is free: three waits hold none of it
        assert [item.id for item in listed.data] == [batch.id]
        client.batches.cancel(batch.id)  # the batch ends: every wait answers now, not at its timeout
        wait_for(client, batch.id)
        for watcher in watchers:
            watcher.join(timeout=60)
            assert not watcher.is_alive()
    finally:
        stop()
