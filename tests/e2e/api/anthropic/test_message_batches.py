"""The official `anthropic` SDK against the real API and the real vLLM engine (the demo model), on SQLite +
a local folder and on Postgres + S3: create -> retrieve -> list pages -> results -> cancel -> delete, a
batch mixing two registry models (two names over the demo model's folder), and every result type.
"""

from __future__ import annotations

import gc
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import pytest
from anthropic.types.messages import MessageBatch

from tests.conftest import Backend, LiveServer, configure, make_key, start_server

pytestmark = pytest.mark.vllm

LONG, SHORT = "demo-long", "demo-short"  # one model folder, two registry entries (the short one: 160-token context)
SYSTEM = "You are a careful Python reviewer. " + " ".join(
    f"Rule {i}: keep functions small and named well." for i in range(40)
)


@pytest.fixture
def live(backend: Backend, demo_model_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[LiveServer]:
    from worker.process import service

    engine = {"path": str(demo_model_path), "dtype": "float32", "max_num_seqs": 8, "kv_cache_memory_bytes": 64 << 20}
    models = {LONG: {**engine, "max_model_len": 1024}, SHORT: {**engine, "max_model_len": 160}}
    configure(
        monkeypatch, {**backend.env, "BACKFILL_MODELS": json.dumps(models), "BACKFILL_REAP_INTERVAL_SECONDS": "1"}
    )
    service.drop_runners()
    server, stop = start_server(with_worker=True)
    assert server.worker is not None and server.worker.ready.wait(300)  # type: ignore[attr-defined]
    yield server
    stop()
    service.close_engines()
    gc.collect()


def client_for(live: LiveServer) -> anthropic.Anthropic:
    return anthropic.Anthropic(api_key=make_key("acme"), base_url=live.base_url, max_retries=0, timeout=120)


def req(custom_id: str, text: str, *, model: str = LONG, max_tokens: int = 8, **params: Any) -> dict[str, Any]:
    body = {"model": model, "max_tokens": max_tokens, "messages": [{"role": "user", "content": text}], **params}
    return {"custom_id": custom_id, "params": body}


def wait_ended(client: anthropic.Anthropic, batch_id: str, timeout: float = 240) -> MessageBatch:
    deadline = time.time() + timeout
    while time.time() < deadline:
        batch = client.messages.batches.retrieve(batch_id)
        counts = batch.request_counts
        assert (
            counts.processing + counts.succeeded + counts.errored + counts.canceled + counts.expired
            == batch_total[batch_id]
        )
        if batch.processing_status == "ended":
            return batch
        time.sleep(0.2)
    raise AssertionError(f"{batch_id} did not end")


batch_total: dict[str, int] = {}


def create(client: anthropic.Anthropic, requests: list[dict[str, Any]]) -> MessageBatch:
    batch = client.messages.batches.create(requests=requests)  # type: ignore[arg-type]
    batch_total[batch.id] = len(requests)
    return batch


def results(client: anthropic.Anthropic, batch_id: str) -> dict[str, Any]:
    return {line.custom_id: line.result for line in client.messages.batches.results(batch_id)}


def stop_string(text: str) -> tuple[str, int]:
    """A 3-character stretch of `text` without whitespace, first found where it starts (so it stops there)."""
    for start in range(2, len(text) - 3):
        piece = text[start : start + 3]
        if piece.strip() == piece and "\ufffd" not in piece and text.find(piece) == start:
            return piece, start
    raise AssertionError(f"no usable stop string in {text!r}")


def test_the_sdk_flow_with_mixed_models_stop_reasons_and_the_prefix_cache(live: LiveServer) -> None:
    client = client_for(live)
    first = create(
        client,
        [
            req("greedy", "def parse(line):", max_tokens=24, temperature=0),
            req("warm", "Review f().", system=SYSTEM, max_tokens=4),
        ],
    )
    assert first.processing_status == "in_progress" and first.results_url is None
    first_done = wait_ended(client, first.id)
    assert first_done.request_counts.succeeded == 2 and first_done.ended_at is not None
    early = results(client, first.id)
    greedy = early["greedy"].message
    assert greedy.stop_reason == "max_tokens" and greedy.usage.output_tokens == 24 and greedy.model == LONG
    text = greedy.content[0].text
    stop, at = stop_string(text)

    prefill = [{"role": "user", "content": "Name a colour."}, {"role": "assistant", "content": "The colour is"}]
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}
    second = create(
        client,
        [
            req("stop", "def parse(line):", max_tokens=24, temperature=0, stop_sequences=[stop]),
            req("cached", "Review g().", system=SYSTEM, max_tokens=4),
            req("short", "import os", model=SHORT, max_tokens=5),
            req("window", "import os", model=SHORT, max_tokens=4096),  # more than the 160-token context leaves
            {"custom_id": "prefill", "params": {"model": LONG, "max_tokens": 6, "messages": prefill}},
            req("unserved", "hi", model="claude-3-5-haiku-latest"),
            {
                "custom_id": "image",
                "params": {"model": LONG, "max_tokens": 4, "messages": [{"role": "user", "content": [image]}]},
            },
        ],
    )
    done = wait_ended(client, second.id)
    counts = done.request_counts
    assert (counts.succeeded, counts.errored, counts.processing) == (5, 2, 0)
    lines = results(client, second.id)

    stopped = lines["stop"].message
    assert (stopped.stop_reason, stopped.stop_sequence) == ("stop_sequence", stop)
    assert (stopped.content[0].text if stopped.content else "") == text[:at]
    cached = lines["cached"].message
    assert (
        cached.usage.cache_read_input_tokens and cached.usage.cache_read_input_tokens > 0
    )  # the system prompt, from batch one
    warm = early["warm"].message.usage
    assert (
        cached.usage.input_tokens + cached.usage.cache_read_input_tokens
        >= warm.input_tokens + (warm.cache_read_input_tokens or 0) - 4
    )
    assert lines["short"].message.model == SHORT and lines["short"].message.stop_reason == "max_tokens"
    window = lines["window"].message
    assert (
        window.model == SHORT
        and window.stop_reason == "model_context_window_exceeded"
        and window.usage.output_tokens < 160
    )
    assert lines["prefill"].type == "succeeded" and lines["prefill"].message.usage.output_tokens == 6
    assert lines["unserved"].error.error.type == "not_found_error"
    assert lines["image"].error.error.type == "invalid_request_error" and "image" in lines["image"].error.error.message

    # Each request ran on its own model's engine.
    from sqlalchemy import select

    from storage.db import transaction
    from storage.models import BatchRequest, EngineRun

    with transaction() as session:
        ran = session.execute(
            select(BatchRequest.custom_id, EngineRun.model)
            .join(EngineRun, EngineRun.id == BatchRequest.run_id)
            .where(BatchRequest.batch_id == second.id)
        ).all()
    expected = {"stop": LONG, "cached": LONG, "short": SHORT, "window": SHORT, "prefill": LONG, "image": LONG}
    assert dict(ran) == expected  # the image request was refused by the long model's engine, as a 400

    # List pages both ways, then delete.
    page = client.messages.batches.list(limit=1)
    assert [b.id for b in page.data] == [second.id] and page.has_more
    assert [b.id for b in client.messages.batches.list(limit=1, after_id=second.id).data] == [first.id]
    before = client.messages.batches.list(limit=1, before_id=first.id)
    assert [b.id for b in before.data] == [second.id] and not before.has_more
    assert [b.id for b in client.messages.batches.list(limit=1)] == [second.id, first.id]
    assert client.messages.batches.retrieve(second.id).model_extra["cost"]["output_tokens"] == sum(  # type: ignore[index]
        lines[c].message.usage.output_tokens for c in ("stop", "cached", "short", "window", "prefill")
    )
    for batch_id in (first.id, second.id):
        assert client.messages.batches.delete(batch_id).type == "message_batch_deleted"
    assert list(client.messages.batches.list()) == []


def test_cancel_and_expiry_end_what_is_left_as_canceled_and_expired(live: LiveServer) -> None:
    from sqlalchemy import update

    from storage.db import transaction
    from storage.models import Batch, BatchRequest

    client = client_for(live)
    long = [req(f"c{i}", f"def f{i}():", max_tokens=200) for i in range(32)]
    cancelled = create(client, long)
    expiring = create(client, [{**r, "custom_id": f"x{i}"} for i, r in enumerate(long)])
    while client.messages.batches.retrieve(cancelled.id).request_counts.succeeded < 1:
        time.sleep(0.1)
    canceling = client.messages.batches.cancel(cancelled.id)
    assert canceling.cancel_initiated_at is not None
    past = int(time.time()) - 1
    with transaction() as session:
        session.execute(update(Batch).where(Batch.id == expiring.id).values(expires_at=past))
        session.execute(update(BatchRequest).where(BatchRequest.batch_id == expiring.id).values(deadline=past))
    for batch_id, ending in ((cancelled.id, "canceled"), (expiring.id, "expired")):
        done = wait_ended(client, batch_id, timeout=120)
        kinds = [line.type for line in results(client, batch_id).values()]
        assert len(kinds) == 32 and set(kinds) <= {"succeeded", ending} and ending in kinds
        assert getattr(done.request_counts, ending) == kinds.count(ending)
        assert done.request_counts.succeeded == kinds.count("succeeded")
    with pytest.raises(anthropic.BadRequestError):
        client.messages.batches.cancel(cancelled.id)


def test_a_batch_cancelled_right_after_create_counts_each_request_once(live: LiveServer) -> None:
    """Issue 19 bug 2 as reported: 60 requests, cancel at once; whatever ran, counts and results agree."""
    client = client_for(live)
    batch = create(client, [req(f"r{i}", f"def f{i}():", max_tokens=512) for i in range(60)])
    client.messages.batches.cancel(batch.id)
    done = wait_ended(client, batch.id, timeout=240)  # checks the counts add up to 60 on every poll
    kinds = [line.type for line in results(client, batch.id).values()]
    assert len(kinds) == 60 and set(kinds) <= {"succeeded", "canceled"}
    assert (done.request_counts.canceled, done.request_counts.succeeded) == (
        kinds.count("canceled"),
        kinds.count("succeeded"),
    )
