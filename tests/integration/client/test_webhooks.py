"""`backfill webhooks add|list|deliveries|rm` against the real API, with a real receiver."""

from __future__ import annotations

import time

import pytest

from tests.conftest import LiveServer
from tests.integration.api.conftest import FAKE_MODELS
from tests.integration.api.helpers import chat_line, to_jsonl, upload, wait_for
from tests.integration.receiver import WEBHOOK_TEST_ENV, running_receiver

pytestmark = [
    pytest.mark.parametrize("backend", ["embedded"], indirect=True),
    pytest.mark.backfill_env({"BACKFILL_MODELS": FAKE_MODELS, **WEBHOOK_TEST_ENV}),
]


def finished_batch(server: LiveServer, key: str, lines: int = 2) -> str:
    client = server.client(key)
    source = upload(client, to_jsonl([chat_line(i) for i in range(lines)]))
    batch = client.batches.create(input_file_id=source.id, endpoint="/v1/chat/completions", completion_window="24h")
    return str(wait_for(client, batch.id).id)


def test_webhooks_add_list_deliveries_and_rm(cli, server: LiveServer, key: str) -> None:  # type: ignore[no-untyped-def]
    with running_receiver() as receiver:
        code, out, _ = cli("webhooks", "add", f"{receiver.url}/hook", "--events", "batch.completed")
        assert code == 0
        endpoint_id = out.split()[1]
        secret = out.strip().splitlines()[-1]
        assert endpoint_id.startswith("whep_") and secret.startswith("whsec_")
        code, out, _ = cli("webhooks", "list")
        assert code == 0 and endpoint_id in out and secret not in out and "batch.completed" in out
        batch_id = finished_batch(server, key, lines=1)
        [post] = receiver.wait_for(1)
        event = server.client(key).webhooks.unwrap(post.body, post.headers, secret=secret)
        assert event.data.id == batch_id
        deadline = time.time() + 10
        while time.time() < deadline:
            code, out, _ = cli("webhooks", "deliveries", endpoint_id)
            if "delivered" in out:
                break
            time.sleep(0.2)
        row = out.splitlines()[2].split()
        assert row[1:6] == ["batch.completed", batch_id, "delivered", "1", "200"]
        code, out, _ = cli("webhooks", "rm", endpoint_id)
        assert code == 0 and out.strip() == f"deleted {endpoint_id}"
    code, _, err = cli("webhooks", "add", "http://10.0.0.1/hook")
    assert code == 1 and "resolves to a private address" in err
