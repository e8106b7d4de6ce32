"""Batch control through the official SDKs' generic calls, on the fake engine (issue 20 §2, §3, §6): pause frees
the engine for other batches and resume brings the batch back, priority on create and later, the background
window. The real engine runs the same flows in tests/e2e/test_batch_control.py."""

from __future__ import annotations

import anthropic
import openai
import pytest
from anthropic.types.messages import MessageBatch
from openai.types import Batch

from tests.conftest import LiveServer, make_key
from tests.integration.api.conftest import FAKE_MODELS
from tests.integration.api.helpers import chat_line, read_lines, to_jsonl, upload, wait_for

pytestmark = pytest.mark.backfill_env({"BACKFILL_MODELS": FAKE_MODELS, "BACKFILL_TENANT_MAX_PRIORITY": "20"})

FOREVER = 10**8  # the fake engine runs such a request until it is aborted


def create(client: openai.OpenAI, lines: list[dict[str, object]], **extra: object) -> Batch:
    source = upload(client, to_jsonl(lines))
    window = str(extra.pop("completion_window", "24h"))
    return client.batches.create(
        input_file_id=source.id,
        endpoint="/v1/chat/completions",
        completion_window=window,  # type: ignore[arg-type]  # the SDK types it Literal["24h"] and sends what it gets
        extra_body=extra or None,
    )


def control(client: openai.OpenAI, batch_id: str, verb: str, **body: object) -> Batch:
    return client.post(f"/batches/{batch_id}/{verb}", body=body, cast_to=Batch)


def test_pausing_a_batch_that_fills_the_engine_lets_another_batch_finish_then_resume_and_cancel(
    api: LiveServer,
) -> None:
    client = api.client(make_key("acme"))
    hog = create(client, [chat_line(i, max_tokens=FOREVER) for i in range(8)])  # all 8 engine slots, for ever
    wait_for(client, hog.id, {"in_progress"})

    paused = control(client, hog.id, "pause")
    again = control(client, hog.id, "pause")  # idempotent
    small = create(client, [chat_line(i, max_tokens=2) for i in range(4)])
    done = wait_for(client, small.id, timeout=60)

    assert paused.status == again.status == "in_progress"
    assert paused.model_extra and paused.model_extra["paused_at"] == again.model_extra["paused_at"] is not None
    assert done.status == "completed" and done.request_counts.completed == 4  # the engine was handed back
    resumed = control(client, hog.id, "resume")
    assert resumed.status == "in_progress" and resumed.model_extra and resumed.model_extra["paused_at"] is None
    control(client, hog.id, "pause")
    client.batches.cancel(hog.id)  # cancel works while paused
    ended = wait_for(client, hog.id)
    errors = read_lines(client, ended.error_file_id)
    assert ended.status == "cancelled" and sorted(line["custom_id"] for line in errors) == [
        f"req-{i}" for i in range(8)
    ]
    with pytest.raises(openai.ConflictError) as conflict:
        control(client, hog.id, "pause")
    assert conflict.value.code == "batch_not_controllable"


def test_priority_is_set_at_create_changed_later_and_capped_per_tenant(api: LiveServer) -> None:
    client = api.client(make_key("acme"))
    batch = create(client, [chat_line(i, max_tokens=FOREVER) for i in range(2)], priority=5)
    assert batch.model_extra and batch.model_extra["priority"] == 5

    raised = control(client, batch.id, "priority", priority=20)
    assert raised.model_extra and raised.model_extra["priority"] == 20
    assert client.batches.retrieve(batch.id).model_extra["priority"] == 20  # type: ignore[index]
    with pytest.raises(openai.BadRequestError) as refused:
        control(client, batch.id, "priority", priority=21)
    assert refused.value.code == "priority_not_allowed" and "up to 20" in str(refused.value.message)
    with pytest.raises(openai.BadRequestError):
        create(client, [chat_line(0)], priority=101)
    client.batches.cancel(batch.id)


def test_a_background_batch_has_no_deadline_runs_on_spare_capacity_and_has_no_goodput(api: LiveServer) -> None:
    client = api.client(make_key("acme"))
    batch = create(client, [chat_line(i, max_tokens=2) for i in range(3)], completion_window="background")
    done = wait_for(client, batch.id, timeout=60)

    assert done.completion_window == "background" and done.expires_at is None  # the SDK parses it
    assert done.status == "completed" and done.request_counts.completed == 3
    assert done.model_extra and done.model_extra["goodput"] is None
    assert done.model_extra["cost"]["discount_pct"] == "60.00"


def test_message_batches_pause_resume_and_reprioritise_through_the_anthropic_sdk(api: LiveServer) -> None:
    client = anthropic.Anthropic(api_key=make_key("acme"), base_url=api.base_url, max_retries=0, timeout=60)
    params = {"model": "fake-model", "max_tokens": FOREVER, "messages": [{"role": "user", "content": "hi"}]}
    batch = client.messages.batches.create(requests=[{"custom_id": "a", "params": params}])  # type: ignore[list-item]
    path = f"/v1/messages/batches/{batch.id}"

    paused = client.post(f"{path}/pause", body={}, cast_to=MessageBatch)
    raised = client.post(f"{path}/priority", body={"priority": 7}, cast_to=MessageBatch)
    resumed = client.post(f"{path}/resume", body={}, cast_to=MessageBatch)

    assert paused.processing_status == "in_progress" and paused.model_extra and paused.model_extra["paused_at"]
    assert raised.model_extra and raised.model_extra["priority"] == 7
    assert resumed.model_extra and resumed.model_extra["paused_at"] is None
    client.messages.batches.cancel(batch.id)
