"""`on_expiry` on create (issue 40 §4) through the official SDKs' `extra_body`: checked, shown on the batch, and a
batch that continues in the background answers each line once in its retry tree's merged view."""

from __future__ import annotations

import json
import time
from typing import Any

import anthropic
import openai
import pytest
from sqlalchemy import update

from storage.db import transaction
from storage.models import Batch, BatchRequest
from tests.conftest import LiveServer, make_key
from tests.integration.api.anthropic.batches import client_for, req
from tests.integration.api.conftest import FAKE_MODELS
from tests.integration.api.helpers import chat_line, to_jsonl, upload, wait_for
from worker.process.service import reap_once

pytestmark = pytest.mark.backfill_env({"BACKFILL_MODELS": FAKE_MODELS})


def window_closes(batch_id: str) -> None:
    past = int(time.time()) - 1
    with transaction() as session:
        session.execute(update(Batch).where(Batch.id == batch_id).values(expires_at=past))
        session.execute(update(BatchRequest).where(BatchRequest.batch_id == batch_id).values(deadline=past))


def create(client: openai.OpenAI, lines: list[dict[str, Any]], window: str = "24h", **extra: object) -> Any:
    source = upload(client, to_jsonl(lines))
    return client.batches.create(
        input_file_id=source.id,
        endpoint="/v1/chat/completions",
        completion_window=window,
        extra_body=extra,  # type: ignore[arg-type]
    )


@pytest.mark.parametrize(
    ("value", "window", "message"),
    [
        ("carry_on", "24h", "on_expiry must be one of continue_in_background"),
        (3, "24h", "'on_expiry': Input should be a valid string"),
        ("continue_in_background", "background", "never expires"),
    ],
)
def test_an_on_expiry_the_server_cannot_honour_is_a_400_naming_it(
    api: LiveServer, value: object, window: str, message: str
) -> None:
    client = api.client(make_key("acme"))
    with pytest.raises(openai.BadRequestError, match=message) as caught:
        create(client, [chat_line(0)], window=window, on_expiry=value)
    assert caught.value.body["param"] == "on_expiry"  # type: ignore[index]


def test_a_batch_that_continues_in_the_background_gives_each_line_once_with_its_whole_answer(api: LiveServer) -> None:
    client = api.client(make_key("acme"))
    lines = [chat_line(0, max_tokens=2)] + [chat_line(i, max_tokens=3000) for i in range(1, 6)]
    batch = create(client, lines, on_expiry="continue_in_background")
    assert batch.model_extra and batch.model_extra["on_expiry"] == "continue_in_background"
    while client.batches.retrieve(batch.id).request_counts.completed < 1:  # type: ignore[union-attr]
        time.sleep(0.05)
    window_closes(batch.id)
    reap_once()  # the reaper's pass now, not at its next tick: the lines are still generating
    origin = wait_for(client, batch.id, timeout=60)
    assert origin.status == "expired" and origin.model_extra["retries"], (origin.model_extra, origin.request_counts)
    (child_id,) = origin.model_extra["retries"]
    child = wait_for(client, child_id, timeout=120)
    assert child.status == "completed" and child.completion_window == "background"
    assert child.model_extra["retry_of"] == batch.id and child.request_counts.completed == 5
    text = client.get(f"/batches/{batch.id}/results", cast_to=str, options={"params": {"merged": "true"}})
    merged = [json.loads(line) for line in text.splitlines() if line]
    assert sorted(line["custom_id"] for line in merged) == sorted(line["custom_id"] for line in lines)  # once each
    for line in merged:
        body = line["response"]["body"]
        asked = 2 if line["custom_id"] == lines[0]["custom_id"] else 3000
        assert body["usage"]["completion_tokens"] == asked and "backfill" not in body


def test_the_anthropic_create_takes_on_expiry_beside_its_requests(api: LiveServer) -> None:
    client = client_for(api, make_key("acme"))
    batch = client.messages.batches.create(requests=[req("a")], extra_body={"on_expiry": "continue_in_background"})
    assert (batch.model_extra or {})["on_expiry"] == "continue_in_background"
    with pytest.raises(anthropic.BadRequestError, match="on_expiry must be one of"):
        client.messages.batches.create(requests=[req("a")], extra_body={"on_expiry": "later"})
