"""Shared mode end to end: a real vLLM server with priority scheduling serves online users while the runner
harvests its idle slots through the HTTP engine; every batch line lands exactly once."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import pytest

from bench import vllm_server as server_process
from tests.conftest import Backend, configure
from tests.e2e.helpers import batch_line, read_file, submit

if TYPE_CHECKING:
    from worker.engine.http_engine import HttpEngine

pytestmark = pytest.mark.vllm

SERVED_NAME = "demo-online"
MAX_NUM_SEQS = 8


@pytest.fixture(scope="module")
def vllm_server(demo_model_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """`python -m vllm.entrypoints.openai.api_server` on the demo model, priority scheduling, a free port."""
    log = tmp_path_factory.mktemp("vllm-server") / "server.log"
    try:
        proc, url = server_process.start(
            demo_model_path, served_name=SERVED_NAME, max_num_seqs=MAX_NUM_SEQS, max_model_len=1024, log=log
        )
    except server_process.ServerFailed as error:
        pytest.fail(str(error))
    try:
        yield url
    finally:
        server_process.stop(proc)


def online_user(url: str, count: int, gap_seconds: float, answers: list[tuple[int, int]]) -> None:
    """An interactive client: default priority, its own short chats, one every `gap_seconds`."""

    def one(i: int) -> None:
        body = {"model": SERVED_NAME, "messages": [{"role": "user", "content": f"hello {i}"}], "max_tokens": 16}
        response = httpx.post(f"{url}/v1/chat/completions", json={**body, "ignore_eos": True}, timeout=60)
        tokens = response.json().get("usage", {}).get("completion_tokens", 0) if response.status_code == 200 else 0
        answers.append((response.status_code, tokens))

    threads = [threading.Thread(target=one, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
        time.sleep(gap_seconds)
    for thread in threads:
        thread.join(60)


def test_a_batch_harvested_beside_online_traffic_lands_every_line_once_and_online_users_are_served(
    backend: Backend, vllm_server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from storage.db import transaction
    from storage.models import Batch
    from storage.settings import get_settings
    from worker.engine.factory import load_engine
    from worker.engine.http_engine import HttpEngine
    from worker.feed.runner import Runner
    from worker.jobs.finalize import finalize_batch

    shared = {"server_url": vllm_server, "poll_seconds": 0.1}
    registry = {"backfill-demo": {"path": "served-by-the-server", "max_num_seqs": MAX_NUM_SEQS, "shared": shared}}
    configure(monkeypatch, {**backend.env, "BACKFILL_MODELS": json.dumps(registry)})
    engine = load_engine(get_settings(), "backfill-demo")
    assert isinstance(engine, HttpEngine) and engine.server_model == SERVED_NAME
    lines = [batch_line(i) for i in range(40)]
    lines.append({**batch_line(99), "body": {**batch_line(99)["body"], "max_tokens": 5000}})  # beyond the context
    batch_id = submit(lines)
    answers: list[tuple[int, int]] = []
    online = threading.Thread(target=online_user, args=(vllm_server, 6, 0.4, answers))
    runner = Runner(engine, model="backfill-demo", settings=get_settings())
    try:
        online.start()
        started = time.monotonic()
        while runner.run_for(5.0):
            assert time.monotonic() - started < 120, "the batch did not finish"
        online.join(90)
    finally:
        engine.close()
    from storage.files.blobs import get_blob_store

    assert finalize_batch(get_blob_store(), batch_id=batch_id) == "completed"
    with transaction() as session:
        batch = session.get(Batch, batch_id)
        assert batch is not None
        outputs, errors = read_file(batch.output_file_id), read_file(batch.error_file_id)
    ids = [line["custom_id"] for line in outputs + errors]
    assert sorted(ids) == sorted(line["custom_id"] for line in lines)  # each line exactly once
    assert [line["custom_id"] for line in errors] == ["b99"]
    refusal = errors[0]["response"]
    assert refusal["status_code"] == 400 and refusal["body"]["error"]["code"] == "context_length_exceeded"
    assert "maximum context length is 1024 tokens" in refusal["body"]["error"]["message"]  # from the server's card
    for line in outputs:
        body = line["response"]["body"]
        assert line["response"]["status_code"] == 200 and body["model"] == "backfill-demo"
        assert body["usage"]["completion_tokens"] == 32
    assert answers == [(200, 16)] * 6
    assert engine.budget.last is not None  # the budget was fed from the server's /metrics


def run_shared(
    backend: Backend, monkeypatch: pytest.MonkeyPatch, shared: dict[str, object], lines: list[dict[str, object]]
) -> tuple[HttpEngine, str]:
    """Run `lines` as one batch through the Runner and an HttpEngine with these shared-mode settings."""
    from storage.settings import get_settings
    from worker.engine.factory import load_engine
    from worker.engine.http_engine import HttpEngine
    from worker.feed.runner import Runner

    registry = {"backfill-demo": {"path": "served-by-the-server", "max_num_seqs": MAX_NUM_SEQS, "shared": shared}}
    configure(monkeypatch, {**backend.env, "BACKFILL_MODELS": json.dumps(registry)})
    engine = load_engine(get_settings(), "backfill-demo")
    assert isinstance(engine, HttpEngine)
    batch_id = submit(lines)
    runner = Runner(engine, model="backfill-demo", settings=get_settings())
    try:
        started = time.monotonic()
        while runner.run_for(5.0):
            assert time.monotonic() - started < 120, "the batch did not finish"
    finally:
        engine.close()
    return engine, batch_id


def assert_every_line_once(batch_id: str, lines: list[dict[str, object]]) -> None:
    from storage.db import transaction
    from storage.files.blobs import get_blob_store
    from storage.models import Batch
    from worker.jobs.finalize import finalize_batch

    assert finalize_batch(get_blob_store(), batch_id=batch_id) == "completed"
    with transaction() as session:
        batch = session.get(Batch, batch_id)
        assert batch is not None
        outputs, errors = read_file(batch.output_file_id), read_file(batch.error_file_id)
    assert not errors
    assert sorted(line["custom_id"] for line in outputs) == sorted(line["custom_id"] for line in lines)


def test_with_a_latency_slack_the_budget_fits_the_servers_step_time_and_every_line_still_lands_once(
    backend: Backend, vllm_server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from worker.engine.shared_budget import slack_cap

    lines = [batch_line(i, max_tokens=64) for i in range(40)]
    shared = {"server_url": vllm_server, "poll_seconds": 0.1, "latency_slack": 0.1}
    engine, batch_id = run_shared(backend, monkeypatch, shared, lines)
    # The server's own inter-token latency fed the step model, and the cap came from it.
    step = engine.budget.steps.fit()
    # The fixed part is clipped at 0 when the measured latencies are noisy (a CPU shared with the test): the
    # model still predicts a positive step for one sequence.
    assert step is not None and step[0] >= 0 and step[0] + step[1] > 0
    last = engine.budget.last
    assert last is not None and last.slack_cap == slack_cap(step, slack=0.1, online=last.online)
    assert_every_line_once(batch_id, lines)


def test_with_prefill_pacing_the_pace_follows_the_servers_steps_and_every_line_still_lands_once(
    backend: Backend, vllm_server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    lines = [batch_line(i, max_tokens=32) for i in range(24)]
    shared = {"server_url": vllm_server, "poll_seconds": 0.1, "batch_prefill_tokens_per_step": 8}
    engine, batch_id = run_shared(backend, monkeypatch, shared, lines)
    # The server's inter-token latency set the pace, and its prompt counts taught the estimate (the demo
    # model's tokenizer is not four characters a token).
    pacer = engine.budget.pacer
    assert pacer is not None and pacer.step_seconds is not None and pacer.step_seconds > 0
    assert pacer.tokens_per_char != 0.25
    assert_every_line_once(batch_id, lines)


def prefix_cache_hits(url: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=5).text
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith("vllm:prefix_cache_hits_total"))


def test_with_staged_prefill_every_line_lands_once_and_the_server_reuses_each_piece_from_its_prefix_cache(
    backend: Backend, vllm_server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # ~600-token prompts, each opening with its own line number (no line shares a block with another); the CPU
    # backend's KV block is 128 tokens, so the pieces are whole blocks of 128.
    filler = " ".join(f"item{j} = compute(item{j - 1})" for j in range(1, 80))
    lines = [batch_line(i, max_tokens=8) for i in range(6)]
    for line in lines:
        body = line["body"]
        body["messages"] = [{"role": "user", "content": f"Line {line['custom_id']}: {filler}"}]  # type: ignore[index]
    stage = {"batch_prefill_tokens_per_step": 1000, "batch_prefill_stage_tokens": 128}
    hits_before = prefix_cache_hits(vllm_server)
    engine, batch_id = run_shared(
        backend, monkeypatch, {"server_url": vllm_server, "poll_seconds": 0.1, **stage}, lines
    )
    hits = prefix_cache_hits(vllm_server) - hits_before
    assert_every_line_once(batch_id, lines)
    extra = engine.stats().extra
    prompts = line_prompt_tokens(batch_id)
    assert min(prompts) > 3 * 128 and extra["stage_plain"] == 0
    pieces = [(n - 1) // 128 for n in prompts]  # pieces of 128, 256, ... short of each prompt's end
    assert extra["stage_pieces"] == sum(pieces)
    # Piece j finds the j - 1 blocks of the piece before it, the request itself all m pieces' blocks.
    assert hits >= sum(128 * m * (m + 1) // 2 for m in pieces)


def line_prompt_tokens(batch_id: str) -> list[int]:
    from storage.db import transaction
    from storage.models import Batch

    with transaction() as session:
        batch = session.get(Batch, batch_id)
        assert batch is not None
        outputs = read_file(batch.output_file_id)
    return [line["response"]["body"]["usage"]["prompt_tokens"] for line in outputs]


def test_aborting_a_batch_request_frees_its_sequence_on_the_server(vllm_server: str) -> None:
    from storage.registry import ModelSpec, SharedModeSpec
    from worker.engine import EngineRequest
    from worker.engine.http_engine import HttpEngine
    from worker.engine.shared_budget import parse_load

    spec = ModelSpec(
        path="served-by-the-server", max_num_seqs=MAX_NUM_SEQS, shared=SharedModeSpec(server_url=vllm_server)
    )
    engine = HttpEngine("backfill-demo", spec)
    try:
        body = {**batch_line(0, max_tokens=1000)["body"]}
        assert engine.add(EngineRequest("long", "/v1/chat/completions", body)) is None

        def running() -> int:
            return parse_load(httpx.get(f"{vllm_server}/metrics", timeout=5).text).running

        deadline = time.monotonic() + 30
        while running() != 1:
            assert time.monotonic() < deadline, "the request never started"
            engine.step()
        engine.abort(["long"])
        assert not engine.has_unfinished()
        deadline = time.monotonic() + 3
        while running() != 0:  # 1,000 tokens take ~10 s here: only the abort ends the request this soon
            assert time.monotonic() < deadline, "the server kept decoding the aborted request"
            time.sleep(0.05)
        assert engine.step() == []
    finally:
        engine.close()


def test_a_responses_request_and_an_over_long_cap_on_a_shared_server(vllm_server: str) -> None:
    from openai.types.responses import Response

    from storage.registry import ModelSpec, SharedModeSpec
    from worker.engine import EngineRequest, EngineResult
    from worker.engine.http_engine import HttpEngine

    spec = ModelSpec(
        path="served-by-the-server", max_num_seqs=MAX_NUM_SEQS, shared=SharedModeSpec(server_url=vllm_server)
    )
    engine = HttpEngine("backfill-demo", spec)
    try:
        assert engine.max_model_len == 1024  # learnt from the server's /v1/models card
        answer = {"model": "x", "input": "Name a color.", "instructions": "Be brief.", "max_output_tokens": 5}
        assert engine.add(EngineRequest("resp", "/v1/responses", {**answer, "ignore_eos": True})) is None
        # Fits alone, not with the prompt: vLLM's server clamps and runs it, the line is still OpenAI's 400.
        ids = [100 + i % 100 for i in range(1000)]
        long_body = {"model": "x", "prompt": ids, "max_tokens": 100}  # 1000 + 100 > 1024; the server runs 24
        assert engine.add(EngineRequest("long", "/v1/completions", long_body)) is None
        results: dict[str, EngineResult] = {}
        deadline = time.monotonic() + 120
        while engine.has_unfinished():
            assert time.monotonic() < deadline, "the server never answered"
            results.update((r.request_id, r) for r in engine.step())
    finally:
        engine.close()
    response = Response.model_validate(results["resp"].body)
    assert response.object == "response" and response.model == "backfill-demo" and response.instructions == "Be brief."
    assert response.usage and response.usage.output_tokens == 5 and response.output[0].content[0].type == "output_text"
    long = results["long"]
    assert (long.status_code, long.error_code, long.completion_tokens) == (400, "context_length_exceeded", 0)


def test_the_openai_sdk_runs_a_batch_through_the_api_on_a_shared_server(
    backend: Backend, vllm_server: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """What an operator configures and a user sees: a `shared` registry entry, `backfill serve`'s API and
    worker, the official SDK; the batch's lines come back from the server that also serves online users."""
    from tests.conftest import make_key, start_server
    from tests.integration.api.helpers import read_lines, to_jsonl, upload, wait_for
    from worker.cli.migrate import migrate_database
    from worker.process import service

    shared = {"server_url": vllm_server, "poll_seconds": 0.1}
    registry = {"backfill-demo": {"path": "served-by-the-server", "max_num_seqs": MAX_NUM_SEQS, "shared": shared}}
    env = {**backend.env, "BACKFILL_MODELS": json.dumps(registry), "BACKFILL_DATA_DIR": str(tmp_path / "data")}
    configure(monkeypatch, env)
    migrate_database()
    service.drop_runners()
    live, stop = start_server(with_worker=True)
    try:
        client = live.client(make_key("acme"))
        lines = [batch_line(i, max_tokens=8) for i in range(12)]
        source = upload(client, to_jsonl(lines))
        batch = client.batches.create(input_file_id=source.id, endpoint="/v1/chat/completions", completion_window="24h")
        done = wait_for(client, batch.id, timeout=180)
        outputs = read_lines(client, done.output_file_id)
    finally:
        stop()
        service.close_engines()
    assert done.status == "completed" and done.request_counts.completed == 12
    assert sorted(line["custom_id"] for line in outputs) == sorted(line["custom_id"] for line in lines)
    assert all(line["response"]["body"]["model"] == "backfill-demo" for line in outputs)
    assert all(line["response"]["body"]["usage"]["completion_tokens"] == 8 for line in outputs)


def test_anthropic_messages_run_on_the_servers_chat_path_and_come_back_as_messages(vllm_server: str) -> None:
    from anthropic.types import Message

    from storage.registry import ModelSpec, SharedModeSpec
    from worker.engine import EngineRequest, EngineResult
    from worker.engine.http_engine import HttpEngine

    spec = ModelSpec(
        path="served-by-the-server", max_num_seqs=MAX_NUM_SEQS, shared=SharedModeSpec(server_url=vllm_server)
    )
    engine = HttpEngine("backfill-demo", spec)

    def run(**params: object) -> EngineResult:
        body = {"model": "backfill-demo", "max_tokens": 24, "messages": [{"role": "user", "content": "def f():"}]}
        assert engine.add(EngineRequest("m", "/v1/messages", {**body, **params})) is None
        deadline = time.monotonic() + 60
        while engine.has_unfinished():
            assert time.monotonic() < deadline
            if results := engine.step():
                return results[0]
        raise AssertionError("no result")

    try:
        greedy = Message.model_validate(run(temperature=0, top_k=5).body)
        assert (
            greedy.stop_reason == "max_tokens" and greedy.usage.output_tokens == 24 and greedy.model == "backfill-demo"
        )
        text = greedy.content[0].text
        start = next(
            i
            for i in range(2, len(text) - 3)
            if text[i : i + 3].strip() == text[i : i + 3] and text.find(text[i : i + 3]) == i
        )
        stopped = Message.model_validate(run(temperature=0, top_k=5, stop_sequences=[text[start : start + 3]]).body)
        assert (stopped.stop_reason, stopped.stop_sequence) == ("stop_sequence", text[start : start + 3])
        assert (stopped.content[0].text if stopped.content else "") == text[:start]
        prefill = [{"role": "user", "content": "Name a colour."}, {"role": "assistant", "content": "The colour is"}]
        assert Message.model_validate(run(messages=prefill, max_tokens=4).body).usage.output_tokens == 4
    finally:
        engine.close()
