"""Partial answers at expiry on the real vLLM engine (tiny demo model), embedded, through the official `anthropic`
SDK (issue 40 §4), the Message Batches counterpart of tests/e2e/test_expiry_partial.py: requests still generating
when the window closes end `succeeded` with the text they generated so far, `stop_reason: "max_tokens"` and
`backfill.cut_by: "expiry"` on the message; with `on_expiry: "continue_in_background"` they carry on from their
checkpoints in a background child Message Batch, and the merged view (`GET /v1/batches/{id}/results?merged=true`,
Anthropic's line format) gives each request once, as the uninterrupted generation would have answered it."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import pytest
from anthropic.types import Message
from anthropic.types.messages import MessageBatch, MessageBatchIndividualResponse

from tests.conftest import LiveServer, make_key
from tests.e2e.resume import (
    EXPIRY_MAX_TOKENS,
    REQUESTS,
    checkpointing_server,
    wait_until_checkpointed_mid_decode,
    window_closes,
)

pytestmark = pytest.mark.vllm


@pytest.fixture
def live(demo_model_path: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[LiveServer]:
    with checkpointing_server(demo_model_path, monkeypatch, tmp_path) as server:
        yield server


def client_for(live: LiveServer) -> anthropic.Anthropic:
    return anthropic.Anthropic(api_key=make_key("acme"), base_url=live.base_url, max_retries=0, timeout=120)


def run(client: anthropic.Anthropic, prefix: str, **extra: Any) -> str:
    """Greedy requests of 960 tokens, the prompts of the OpenAI test's lines (the SDK has no `ignore_eos`)."""
    requests = [
        {
            "custom_id": f"{prefix}{i}",
            "params": {
                "model": "backfill-demo",
                "max_tokens": EXPIRY_MAX_TOKENS,
                "temperature": 0,
                "messages": [{"role": "user", "content": f"Write function number {i}."}],
            },
        }
        for i in range(REQUESTS)
    ]
    return client.messages.batches.create(requests=requests, extra_body=extra).id  # type: ignore[arg-type]


def wait_ended(client: anthropic.Anthropic, batch_id: str, timeout: float) -> MessageBatch:
    deadline = time.monotonic() + timeout
    while True:
        batch = client.messages.batches.retrieve(batch_id)
        if batch.processing_status == "ended":
            return batch
        assert time.monotonic() < deadline, f"{batch_id} did not end: {batch.request_counts}"
        time.sleep(0.2)


def results(client: anthropic.Anthropic, batch_id: str, prefix: str) -> dict[str, Any]:
    """Each request's result by its number (the custom_id without `prefix`), through the SDK."""
    return {line.custom_id.removeprefix(prefix): line.result for line in client.messages.batches.results(batch_id)}


def text(message: Message) -> str:
    return "".join(block.text for block in message.content if block.type == "text")  # no text block when empty


def reference(client: anthropic.Anthropic) -> dict[str, Message]:
    """The uninterrupted greedy answers."""
    done = wait_ended(client, run(client, "ref-"), timeout=600)
    assert done.request_counts.succeeded == REQUESTS
    return {number: result.message for number, result in results(client, done.id, "ref-").items()}


def test_requests_generating_at_expiry_end_with_the_text_so_far_as_max_tokens(live: LiveServer) -> None:
    client = client_for(live)
    full = reference(client)
    batch_id = run(client, "cut-")
    wait_until_checkpointed_mid_decode(batch_id, alive=lambda: True)
    window_closes(batch_id)

    done = wait_ended(client, batch_id, timeout=120)
    lines = results(client, batch_id, "cut-")
    assert sorted(lines) == sorted(full)  # each request once
    cut = {number: result.message for number, result in lines.items() if result.type == "succeeded"}
    assert cut and {result.type for result in lines.values()} <= {"succeeded", "expired"}
    assert (done.request_counts.succeeded, done.request_counts.expired) == (len(cut), REQUESTS - len(cut))
    for number, message in cut.items():
        if "backfill" not in (message.model_extra or {}):  # it ended by itself before its worker's renewal
            assert (text(message), message.stop_reason) == (text(full[number]), full[number].stop_reason)
            continue
        assert (message.model_extra or {})["backfill"] == {"cut_by": "expiry"}
        assert message.stop_reason == "max_tokens"  # the SDK's StopReason, not a context-window stop
        assert 1 <= message.usage.output_tokens < full[number].usage.output_tokens <= EXPIRY_MAX_TOKENS
        assert text(full[number]).startswith(text(message))  # what the uninterrupted generation had at that token
    marked = sorted(m.usage.output_tokens for m in cut.values() if "backfill" in (m.model_extra or {}))
    assert marked, "no request was cut at expiry"
    one = next(message for message in cut.values() if "backfill" in (message.model_extra or {}))
    print(f"a cut message: {one.stop_reason}, {one.usage.output_tokens} tokens, {one.model_extra}, {text(one)[:40]!r}")
    uninterrupted = sorted({(m.stop_reason, m.usage.output_tokens) for m in full.values()})
    print(
        f"cut at expiry: {len(cut)} requests ({marked} tokens), {REQUESTS - len(cut)} expired; whole: {uninterrupted}"
    )
    assert done.model_extra and float(done.model_extra["cost"]["billed_usd"]) > 0  # billed for what was generated


def test_a_message_batch_continued_in_the_background_answers_each_request_once_as_if_never_interrupted(
    live: LiveServer,
) -> None:
    from worker.process.service import reap_once

    client = client_for(live)
    full = reference(client)
    batch_id = run(client, "bg-", on_expiry="continue_in_background")
    wait_until_checkpointed_mid_decode(batch_id, alive=lambda: True)
    window_closes(batch_id)
    reap_once()  # the reaper's pass now: the requests are mid-generation

    origin = wait_ended(client, batch_id, timeout=120)
    assert origin.model_extra and origin.model_extra["on_expiry"] == "continue_in_background"
    (child_id,) = origin.model_extra["retries"]
    continued = origin.request_counts.expired  # the origin writes no answer for them: the child does
    assert continued >= 1 and origin.request_counts.succeeded + continued == REQUESTS
    child = wait_ended(client, child_id, timeout=600)
    assert child.model_extra and child.model_extra["completion_window"] == "background"
    assert child.model_extra["retry_of"] == batch_id and child.request_counts.succeeded == continued
    body = client.get(f"/v1/batches/{batch_id}/results", cast_to=str, options={"params": {"merged": "true"}})
    merged = [MessageBatchIndividualResponse.model_validate(json.loads(line)) for line in body.splitlines() if line]
    assert sorted(line.custom_id for line in merged) == sorted(f"bg-{number}" for number in full)  # once each
    for line in merged:
        assert line.result.type == "succeeded"
        message, uninterrupted = line.result.message, full[line.custom_id.removeprefix("bg-")]
        assert "backfill" not in (message.model_extra or {})
        assert (message.stop_reason, message.usage.output_tokens) == (
            uninterrupted.stop_reason,
            uninterrupted.usage.output_tokens,
        )
        assert text(message) == text(uninterrupted)  # token-exact: the resumed requests read as the uninterrupted ones
    print(f"continued in the background: {continued} of {REQUESTS} requests in {child_id}")
    costs = [origin.model_extra["cost"] or {}, child.model_extra["cost"] or {}]  # null: nothing billable there
    assert float(costs[1]["billed_usd"]) > 0
    billed = sum(int(cost.get("output_tokens", 0)) for cost in costs)
    assert billed == sum(message.usage.output_tokens for message in full.values())  # each token billed once
