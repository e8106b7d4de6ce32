"""Staged prefill against a scripted fake of vLLM's server: the pieces go out one after another as growing
token-id prefixes ahead of the real request, whose answer alone becomes the line's; anything unusual falls back
to sending the request as it is; an abort ends the staging; the pace gate spends each piece in turn."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from pydantic import ValidationError

from storage.registry import ModelSpec, SharedModeSpec
from worker.engine import EngineRequest, EngineResult
from worker.engine.http_engine import HttpEngine
from worker.engine.prefill_pace import PrefillPacer
from worker.engine.prefill_stage import PaceGate, piece_ends, prompt_ids, tokenize_body

CHAT = "/v1/chat/completions"
BATCH = 1_000_000


class StagingServer:
    """vLLM in miniature for one prompt: /tokenize gives one id per word, a prefix cache of 16-token blocks."""

    def __init__(self, *, cached: int = 0) -> None:
        self.cached = cached  # leading prompt tokens in the prefix cache
        self.log: list[tuple[str, dict[str, Any]]] = []
        self.tokenize_status = 200
        self.fail_piece: int | None = None  # the piece (0-based) that gets a 500
        self.hold = asyncio.Event()
        self.holding = False  # pieces wait for `hold` to be set
        self.cancelled = 0
        self.polls = 0

    async def handle(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if path == "/v1/models":
            return httpx.Response(200, json={"object": "list", "data": [{"id": "served-name", "max_model_len": 4096}]})
        if path == "/metrics":  # a 1 ms step, so the pace is known after two polls
            self.polls += 1
            text = (
                'vllm:num_requests_running{engine="0"} 0\nvllm:num_requests_waiting{engine="0"} 0\n'
                f'vllm:kv_cache_usage_perc{{engine="0"}} 0.1\nvllm:inter_token_latency_seconds_sum{{engine="0"}} '
                f'{self.polls * 0.1}\nvllm:inter_token_latency_seconds_count{{engine="0"}} {self.polls * 100}\n'
            )
            return httpx.Response(200, text=text)
        body = json.loads(await request.aread())
        self.log.append((path, body))
        if path == "/v1/load_lora_adapter":
            return httpx.Response(200, text="Success")
        if path == "/tokenize":
            if self.tokenize_status != 200:
                return httpx.Response(self.tokenize_status, json={"error": {"message": "no"}})
            words = sum(len(m["content"].split()) for m in body["messages"])
            return httpx.Response(200, json={"count": words, "max_model_len": 4096, "tokens": list(range(words))})
        if path == "/v1/completions":
            index = sum(1 for p, _ in self.log if p == path) - 1
            if index == self.fail_piece:
                return httpx.Response(500, json={"error": {"message": "engine died"}})
            if self.holding:
                try:
                    await self.hold.wait()
                except asyncio.CancelledError:
                    self.cancelled += 1
                    raise
            return httpx.Response(200, json=self._answer(len(body["prompt"]), 1, "text_completion"))
        words = sum(len(m["content"].split()) for m in body["messages"])
        return httpx.Response(200, json=self._answer(words, body["max_tokens"], "chat.completion"))

    def _answer(self, prompt: int, tokens: int, kind: str) -> dict[str, Any]:
        hit = min(self.cached, (prompt - 1) // 16 * 16)  # vLLM computes at least a prompt's last token
        self.cached = max(self.cached, prompt // 16 * 16)
        choice = {"index": 0, "message": {"role": "assistant", "content": "x"}, "text": "x", "finish_reason": "length"}
        details = {"cached_tokens": hit}
        usage = {"prompt_tokens": prompt, "completion_tokens": tokens, "prompt_tokens_details": details}
        return {"id": "x-1", "object": kind, "created": 1, "model": "served-name", "choices": [choice], "usage": usage}

    def pieces(self) -> list[int]:
        return [len(body["prompt"]) for path, body in self.log if path == "/v1/completions"]

    def paths(self) -> list[str]:
        return [path for path, _ in self.log]


def start(server: StagingServer, *, enable_lora: bool = False, **shared: Any) -> HttpEngine:
    knobs = {
        "server_url": "http://fake",
        "poll_seconds": 0.01,
        "batch_prefill_tokens_per_step": 10_000,  # 10M tokens/s: the pace never holds these tests up
        "batch_prefill_stage_tokens": 32,
        **shared,
    }
    spec = ModelSpec(path="served-elsewhere", max_num_seqs=8, enable_lora=enable_lora, shared=SharedModeSpec(**knobs))
    return HttpEngine("backfill-demo", spec, transport=httpx.MockTransport(server.handle))


@pytest.fixture
def server() -> StagingServer:
    return StagingServer()


@pytest.fixture
def engine(server: StagingServer) -> Iterator[HttpEngine]:
    engine = start(server)
    yield engine
    engine.close()


def chat(request_id: str, words: int, **extra: Any) -> EngineRequest:
    content = " ".join(["w"] * words)
    body = {"model": "backfill-demo", "messages": [{"role": "user", "content": content}], "max_tokens": 3, **extra}
    return EngineRequest(request_id, CHAT, body)


def drain(engine: HttpEngine) -> list[EngineResult]:
    results: list[EngineResult] = []
    until = time.monotonic() + 10
    while engine.has_unfinished():
        assert time.monotonic() < until, "the engine never finished"
        results.extend(engine.step())
    return results


def test_pieces_end_every_k_tokens_short_of_the_prompt_and_none_past_the_cap() -> None:
    assert piece_ends(100, piece_tokens=32, max_pieces=8) == [32, 64, 96]
    assert piece_ends(96, piece_tokens=32, max_pieces=8) == [32, 64]  # the request itself computes its last 32
    assert piece_ends(32, piece_tokens=32, max_pieces=8) == []  # short prompts go as they are
    assert piece_ends(10_000, piece_tokens=32, max_pieces=8) == []  # too many pieces: sent whole


def test_what_is_asked_of_tokenize_carries_the_fields_that_shape_a_chats_tokens() -> None:
    messages = [{"role": "user", "content": "hi"}]
    body = tokenize_body(CHAT, {"model": "m", "messages": messages, "tools": [], "max_tokens": 3, "priority": BATCH})
    assert body == {"model": "m", "messages": messages, "tools": []}
    image = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x"}}]}]
    assert tokenize_body(CHAT, {"model": "m", "messages": image}) is None  # not plain text: sent as it is
    assert tokenize_body("/v1/completions", {"model": "m", "prompt": "a b"}) == {"model": "m", "prompt": "a b"}
    assert tokenize_body("/v1/embeddings", {"model": "m", "input": "a b"}) is None
    assert prompt_ids("/v1/completions", {"prompt": [5, 6, 7]}) == [5, 6, 7]  # token ids already


def test_a_staged_request_sends_growing_prefixes_one_at_a_time_then_itself_and_only_its_answer_is_the_lines(
    engine: HttpEngine, server: StagingServer
) -> None:
    assert engine.add(chat("r1", 100)) is None
    (result,) = drain(engine)
    assert server.paths() == ["/tokenize", *["/v1/completions"] * 3, CHAT]
    assert server.pieces() == [32, 64, 96]
    pieces = [body for path, body in server.log if path == "/v1/completions"]
    assert all(p["max_tokens"] == 1 and p["priority"] == BATCH and p["model"] == "served-name" for p in pieces)
    assert pieces[-1]["prompt"] == list(range(96))  # the prompt's own token ids
    assert (result.prompt_tokens, result.completion_tokens) == (100, 3)  # the real request's usage, not a piece's
    assert result.cached_tokens == 0  # the pieces' hits (96 tokens for the request itself) are not the line's
    assert result.body["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    extra = engine.stats().extra
    assert (extra["stage_pieces"], extra["stage_piece_tokens"], extra["stage_plain"]) == (3, 96, 0)


def test_a_staged_adapter_line_loads_its_adapter_first_and_stages_its_pieces_under_it(server: StagingServer) -> None:
    engine = start(server, enable_lora=True)
    request = chat("r1", 40)
    request = EngineRequest("r1", CHAT, {**request.body, "model": "tone"}, adapter="tone", adapter_path="/adapters/t")
    try:
        assert engine.add(request) is None
        (result,) = drain(engine)
    finally:
        engine.close()
    assert server.paths() == ["/v1/load_lora_adapter", "/tokenize", "/v1/completions", CHAT]
    assert {body["model"] for path, body in server.log[1:]} == {"tone"}  # a prefix cached under its adapter
    assert result.status_code == 200 and result.body["model"] == "tone"


def test_tokens_the_server_had_cached_before_staging_are_still_the_lines_cached_tokens() -> None:
    server = StagingServer(cached=48)  # a shared prefix of 48 tokens was in the cache already
    engine = start(server)
    try:
        assert engine.add(chat("r1", 100)) is None
        (result,) = drain(engine)
    finally:
        engine.close()
    # piece 32: 16 hit (one token short); piece 64: 48 hit, 16 of them beyond the 32 staged: 16 + 16 = 32 of 48
    # (each piece recomputes its last block, so the count errs low, never high).
    assert result.cached_tokens == 32


@pytest.mark.parametrize("case", ["tokenize fails", "a piece fails", "too many pieces"])
def test_when_staging_cannot_go_on_the_request_is_sent_as_it_is_and_answers_once(case: str) -> None:
    server = StagingServer()
    shared: dict[str, Any] = {}
    if case == "tokenize fails":
        server.tokenize_status = 404  # e.g. a proxy in front of vLLM without /tokenize
    elif case == "a piece fails":
        server.fail_piece = 1
    else:
        shared = {"batch_prefill_stage_max_pieces": 2}
    engine = start(server, **shared)
    try:
        assert engine.add(chat("r1", 100)) is None
        (result,) = drain(engine)
        plain = engine.stats().extra["stage_plain"]
    finally:
        engine.close()
    assert result.status_code == 200 and result.prompt_tokens == 100
    assert server.paths()[-1] == CHAT and server.paths().count(CHAT) == 1
    assert plain == 1
    assert server.pieces() == {"tokenize fails": [], "a piece fails": [32, 64], "too many pieces": []}[case]


def test_an_abort_during_staging_cancels_the_piece_on_the_server_and_sends_nothing_more(
    engine: HttpEngine, server: StagingServer
) -> None:
    server.holding = True
    assert engine.add(chat("r1", 100)) is None
    until = time.monotonic() + 10
    while not server.pieces():
        assert time.monotonic() < until
        engine.step()
    engine.abort(["r1"])
    until = time.monotonic() + 10
    while not server.cancelled:
        assert time.monotonic() < until, "the piece was not cancelled"
        time.sleep(0.01)
    assert not engine.has_unfinished() and engine.step() == []
    assert server.pieces() == [32] and CHAT not in server.paths()


def test_without_pacing_or_on_a_partial_block_staging_is_refused_at_start() -> None:
    with pytest.raises(ValidationError, match="needs batch_prefill_tokens_per_step"):
        SharedModeSpec(server_url="http://x", batch_prefill_stage_tokens=64)
    with pytest.raises(ValidationError, match="multiple of 16"):
        SharedModeSpec(server_url="http://x", batch_prefill_tokens_per_step=10, batch_prefill_stage_tokens=40)


def test_the_gate_spends_each_turn_and_holds_the_next_until_the_bucket_refills() -> None:
    clock = [100.0]
    pacer = PrefillPacer(10, burst_tokens=16, step_seconds=0.01)  # 1,000 tokens/s

    async def scenario() -> None:
        gate = PaceGate(pacer, clock=lambda: clock[0])
        assert await gate.enter(32) is False  # the first turn goes at once
        assert pacer.bucket == -32
        second = asyncio.ensure_future(gate.enter(32))
        for _ in range(5):
            await asyncio.sleep(0.002)
        assert not second.done() and gate.waiting == 1  # the clock stands still: the bucket stays in debt
        clock[0] += 0.033  # 33 tokens' worth of steps (the bucket saves at most 16)
        assert await asyncio.wait_for(second, 5) is False
        assert pacer.bucket == pytest.approx(-31) and gate.waiting == 0

    asyncio.run(scenario())


def test_until_the_pace_is_known_one_turn_holds_the_gate_until_it_ends() -> None:
    async def scenario() -> None:
        gate = PaceGate(PrefillPacer(10))  # no step time yet
        held = await gate.enter(500)
        assert held is True
        second = asyncio.ensure_future(gate.enter(500))
        for _ in range(5):
            await asyncio.sleep(0)
        assert not second.done()
        gate.leave(held)
        assert await asyncio.wait_for(second, 5) is True

    asyncio.run(scenario())
