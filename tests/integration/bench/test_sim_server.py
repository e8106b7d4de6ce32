"""The GPU-timed server speaks the vLLM surface shared mode reads: the real HTTP engine submits to it, a user
streams from it, an abort frees the slot, and its /metrics feed the dispatch budget."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator

import httpx
import pytest
import uvicorn

from bench.sim_scheduler import StepTrace
from bench.sim_server import build
from storage.registry import ModelSpec, SharedModeSpec
from tests.conftest import free_port
from worker.engine import EngineRequest, EngineResult
from worker.engine.http_engine import HttpEngine

SERVED = "sim-online"


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    """The simulated 70B-on-8xH100 server under uvicorn on a free port, in a thread of this process."""
    port = free_port()
    config = uvicorn.Config(build(served_name=SERVED, max_num_seqs=16).app(), port=port, log_level="warning")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_for(lambda: server.started)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(10)


def wait_for(condition: Callable[[], bool], seconds: float = 20.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "the condition never held"
        time.sleep(0.01)


def gauge(url: str, name: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=5).text
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(name + "{"))


def chat(request_id: str, tokens: int) -> EngineRequest:
    body = {"model": "backfill-demo", "messages": [{"role": "user", "content": "a b c d"}], "max_tokens": tokens}
    return EngineRequest(request_id, "/v1/chat/completions", body)


@pytest.fixture
def engine(url: str) -> Iterator[HttpEngine]:
    shared = SharedModeSpec(server_url=url, poll_seconds=0.05, min_inflight=4)
    engine = HttpEngine("backfill-demo", ModelSpec(path="served-elsewhere", max_num_seqs=16, shared=shared))
    yield engine
    engine.close()


def test_the_http_engine_submits_to_the_simulated_server_and_gets_every_answer(engine: HttpEngine, url: str) -> None:
    assert engine.server_model == SERVED and engine.max_model_len == 8192  # from its /v1/models card
    for i in range(3):
        assert engine.add(chat(f"r{i}", 8)) is None
    results: list[EngineResult] = []
    deadline = time.monotonic() + 20
    while engine.has_unfinished():
        assert time.monotonic() < deadline
        results.extend(engine.step())
    assert sorted(r.request_id for r in results) == ["r0", "r1", "r2"]
    assert all(r.status_code == 200 and r.completion_tokens == 8 and r.prompt_tokens == 6 for r in results)
    # the budget parsed /metrics: 7 inter-token gaps per request
    wait_for(lambda: (load := engine.budget.load) is not None and (load.itl_tokens or 0) >= 3 * 7)


def test_an_aborted_request_leaves_the_server(engine: HttpEngine, url: str) -> None:
    assert engine.add(chat("long", 8000)) is None  # ~20 s of decoding at this step time
    wait_for(lambda: gauge(url, "vllm:num_requests_running") == 1)
    engine.abort(["long"])
    wait_for(lambda: gauge(url, "vllm:num_requests_running") == 0)
    assert not engine.has_unfinished()


def test_an_online_user_streams_one_chunk_per_step_and_the_usage(url: str) -> None:
    httpx.post(f"{url}/sim/online-timings", timeout=5)  # forget the requests of earlier tests
    body = {
        "model": SERVED,
        "messages": [{"role": "user", "content": "hello there"}],
        "max_tokens": 12,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    chunks = []
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=20) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunks.append(json.loads(line[6:]))
    text = "".join(c["choices"][0]["delta"]["content"] for c in chunks if c["choices"])
    assert len(text.split()) == 12 and chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert chunks[-1]["usage"] == {"prompt_tokens": 4, "completion_tokens": 12, "total_tokens": 16}
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "length"
    ((ttft, tpot),) = httpx.post(f"{url}/sim/online-timings", timeout=5).json()  # on the server's own clock
    assert 0 < ttft < 1 and 0 < tpot < 0.1


def test_staged_prompts_reach_the_simulated_servers_prefix_cache_and_answer_once(url: str) -> None:
    """/tokenize and token-id prompts as vLLM has them: each piece finds the one before it cached."""
    words = " ".join(f"w{j}" for j in range(98))  # 98 words + the message's 2 markers = 100 tokens
    ids = httpx.post(f"{url}/tokenize", json={"messages": [{"role": "user", "content": words}]}, timeout=5).json()
    assert ids["count"] == 100 and len(ids["tokens"]) == 100
    as_prompt = httpx.post(f"{url}/tokenize", json={"prompt": words}, timeout=5).json()["tokens"]
    assert as_prompt == ids["tokens"][1:-1]  # the same words, the same ids
    hits = gauge(url, "vllm:prefix_cache_hits_total")
    shared = SharedModeSpec(
        server_url=url, poll_seconds=0.05, batch_prefill_tokens_per_step=1000, batch_prefill_stage_tokens=32
    )
    engine = HttpEngine("backfill-demo", ModelSpec(path="served-elsewhere", max_num_seqs=16, shared=shared))
    try:
        for i in range(2):
            body = {"model": "m", "messages": [{"role": "user", "content": f"r{i} {words}"}], "max_tokens": 4}
            assert engine.add(EngineRequest(f"r{i}", "/v1/chat/completions", body)) is None
        results: list[EngineResult] = []
        deadline = time.monotonic() + 20
        while engine.has_unfinished():
            assert time.monotonic() < deadline
            results.extend(engine.step())
        staged = engine.stats().extra["stage_pieces"]
    finally:
        engine.close()
    assert sorted((r.request_id, r.prompt_tokens, r.completion_tokens) for r in results) == [
        ("r0", 101, 4),
        ("r1", 101, 4),
    ]
    assert staged == 2 * 3  # pieces of 32, 64 and 96 tokens
    # per prompt: the pieces find 0, 32 and 64 tokens, the request itself 96
    assert gauge(url, "vllm:prefix_cache_hits_total") - hits == 2 * (32 + 64 + 96)


def test_the_trace_keeps_each_step_and_each_online_request_once_asked(url: str) -> None:
    httpx.post(f"{url}/sim/trace", timeout=5)  # the first call starts keeping them
    body = {"model": SERVED, "messages": [{"role": "user", "content": "one two three"}], "max_tokens": 4}
    with httpx.stream("POST", f"{url}/v1/chat/completions", json={**body, "stream": True}, timeout=20) as response:
        assert [line for line in response.iter_lines() if line == "data: [DONE]"]
    trace = httpx.post(f"{url}/sim/trace", timeout=5).json()
    ((user),) = trace["online"]
    assert user["arrival"] < user["first_token"] <= user["first_sent"]  # on this machine's monotonic clock
    assert user["first_sent"] <= time.perf_counter()
    steps = [StepTrace(*step) for step in trace["steps"]]
    assert len(steps) >= 4  # its prompt's step, then three decodes
    (prefill,) = [step for step in steps if step.end == user["first_token"]]  # the step that gave its first token
    assert (prefill.online_prompts, prefill.online_prefill, prefill.piece_prefill, prefill.batch_seconds) == (
        1,
        5,
        0,
        0,
    )
    assert httpx.post(f"{url}/sim/trace", timeout=5).json() == {"steps": [], "online": []}  # each call forgets
