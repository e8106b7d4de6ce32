"""The shared-mode HTTP engine against a scripted fake of vLLM's server: one result per request, always.

The fake answers through httpx's MockTransport, so the engine's own client, threads, retries and
cancellations run for real; the behaviour of a real server is covered in tests/e2e/worker/test_shared_mode.py.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from openai.types.chat import ChatCompletion
from openai.types.responses import Response

from storage.registry import ModelSpec, SharedModeSpec
from worker.engine import Engine, EngineRequest, EngineResult, http_calls, http_engine
from worker.engine.http_engine import HttpEngine

CHAT = "/v1/chat/completions"


class FakeServer:
    """vLLM's OpenAI server in miniature: a request's first message says how to answer it."""

    def __init__(self) -> None:
        self.running = 0
        self.waiting = 0
        self.metrics_running: int | None = None  # force what /metrics reports (None: what is really open)
        self.metrics_down = False
        self.calls: Counter[str] = Counter()
        self.bodies: list[dict[str, Any]] = []
        self.paths: list[str] = []
        self.cached_tokens: int | None = None  # reported as prompt_tokens_details (--enable-prompt-tokens-details)
        self.cancelled: list[str] = []
        self.release = asyncio.Event()

    async def handle(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/models":
            card = {"id": "served-name", "max_model_len": 1024}  # vLLM's model card carries the context length
            return httpx.Response(200, json={"object": "list", "data": [card]})
        if request.url.path == "/metrics":
            if self.metrics_down:
                return httpx.Response(503, text="restarting")
            running = self.running if self.metrics_running is None else self.metrics_running
            text = (
                f'vllm:num_requests_running{{engine="0"}} {running}\n'
                f'vllm:num_requests_waiting{{engine="0"}} {self.waiting}\n'
                'vllm:kv_cache_usage_perc{engine="0"} 0.1\n'
            )
            return httpx.Response(200, text=text)
        payload = json.loads(await request.aread())
        self.bodies.append(payload)
        self.paths.append(request.url.path)
        script = payload["messages"][0]["content"]
        self.calls[script] += 1
        self.running += 1
        try:
            return await self._answer(script, payload)
        except asyncio.CancelledError:
            self.cancelled.append(script)
            if self.waiting:  # the slot we gave up goes to the online request that waited for it
                self.waiting, self.metrics_running = self.waiting - 1, None
            raise
        finally:
            self.running -= 1

    async def _answer(self, script: str, payload: dict[str, Any]) -> httpx.Response:
        kind, _, arg = script.partition(":")
        if kind == "fail" and self.calls[script] <= int(arg):
            return httpx.Response(500, json={"error": {"message": "engine died", "type": "InternalServerError"}})
        if kind == "drop" and self.calls[script] <= int(arg):
            raise httpx.ConnectError("connection refused")
        if kind == "abort" and self.calls[script] <= int(arg):
            return httpx.Response(200, json=completion(payload, finish_reason="abort"))
        if kind == "bad":
            error = {"message": "max_tokens=5000 cannot be greater than max_model_len=1024.", "type": "BadRequestError"}
            return httpx.Response(400, json={"error": {**error, "param": "max_tokens", "code": 400}})
        if kind == "hold":
            await self.release.wait()
        answer = completion(payload)
        if self.cached_tokens is not None:
            answer["usage"]["prompt_tokens_details"] = {"cached_tokens": self.cached_tokens}
        return httpx.Response(200, json=answer)


def completion(payload: dict[str, Any], finish_reason: str = "length") -> dict[str, Any]:
    choice = {"index": 0, "message": {"role": "assistant", "content": "x y"}, "finish_reason": finish_reason}
    usage = {"prompt_tokens": 7, "completion_tokens": payload["max_tokens"], "total_tokens": 7 + payload["max_tokens"]}
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1,
        "model": payload["model"],
        "choices": [choice],
        "usage": usage,
    }


def spec(**shared: Any) -> ModelSpec:
    knobs = {"server_url": "http://fake", "poll_seconds": 0.01, "min_inflight": 4, **shared}
    return ModelSpec(path="served-elsewhere", max_num_seqs=8, shared=SharedModeSpec(**knobs))


@pytest.fixture
def server() -> FakeServer:
    return FakeServer()


@pytest.fixture(autouse=True)
def quick_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(http_calls, "RETRY_BASE_SECONDS", 0.01)


def start(server: FakeServer, **shared: Any) -> HttpEngine:
    return HttpEngine("backfill-demo", spec(**shared), transport=httpx.MockTransport(server.handle))


@pytest.fixture
def engine(server: FakeServer) -> Iterator[HttpEngine]:
    engine = start(server)
    yield engine
    engine.close()


def chat(request_id: str, script: str = "ok", **extra: Any) -> EngineRequest:
    body = {"model": "backfill-demo", "messages": [{"role": "user", "content": script}], "max_tokens": 3, **extra}
    return EngineRequest(request_id, CHAT, body)


def drain(engine: HttpEngine, seconds: float = 10.0) -> list[EngineResult]:
    results: list[EngineResult] = []
    until = time.monotonic() + seconds
    while engine.has_unfinished():
        assert time.monotonic() < until, "the engine never finished"
        results.extend(engine.step())
    return results


def test_it_satisfies_the_engine_protocol_and_learns_the_served_model_name(engine: HttpEngine) -> None:
    protocol: Engine = engine
    assert protocol.max_num_seqs == 8 and engine.server_model == "served-name"


def test_a_request_goes_out_at_batch_priority_under_the_servers_name_and_comes_back_under_ours(
    engine: HttpEngine, server: FakeServer
) -> None:
    assert engine.add(chat("r1", ignore_eos=True)) is None
    (result,) = drain(engine)
    assert server.bodies[0]["model"] == "served-name" and server.bodies[0]["priority"] == 1_000_000
    assert server.bodies[0]["ignore_eos"] is True
    body = ChatCompletion.model_validate(result.body)
    assert result.status_code == 200 and body.model == "backfill-demo"
    assert (result.prompt_tokens, result.completion_tokens) == (7, 3) and result.engine_seconds > 0


def test_a_body_the_in_process_engine_would_refuse_is_refused_without_a_call(
    engine: HttpEngine, server: FakeServer
) -> None:
    refused = engine.add(chat("r1", stream=True))
    assert refused is not None and refused.status_code == 400 and refused.error_code == "unsupported_parameter"
    assert not engine.has_unfinished() and not server.bodies


def test_a_4xx_is_this_lines_error_with_the_servers_message(engine: HttpEngine, server: FakeServer) -> None:
    engine.add(chat("r1", "bad"))
    (result,) = drain(engine)
    assert result.status_code == 400 and result.error_code == "invalid_request"
    assert result.error_message and "max_model_len" in result.error_message
    assert result.body["error"]["param"] == "max_tokens" and server.calls["bad"] == 1


@pytest.mark.parametrize("script", ["fail:2", "drop:2", "abort:2"])
def test_5xx_dropped_connections_and_aborted_sequences_are_retried_into_one_result(
    engine: HttpEngine, server: FakeServer, script: str
) -> None:
    engine.add(chat("r1", script))
    results = drain(engine)
    assert [r.status_code for r in results] == [200] and server.calls[script] == 3


def test_a_request_failing_every_attempt_ends_in_one_server_error(engine: HttpEngine, server: FakeServer) -> None:
    engine.add(chat("r1", "fail:99"))
    (result,) = drain(engine)
    assert result.status_code == 500 and result.error_code == "engine_error"
    assert result.error_message and "3 times" in result.error_message and server.calls["fail:99"] == 3


def test_abort_closes_the_call_and_no_result_ever_follows(engine: HttpEngine, server: FakeServer) -> None:
    engine.add(chat("r1", "hold"))
    engine.add(chat("r2"))
    assert [r.request_id for r in drain_until(engine, 1)] == ["r2"]
    engine.abort(["r1"])
    assert not engine.has_unfinished()
    wait_for(lambda: server.cancelled == ["hold"])
    engine._run(_release(server))
    assert engine.step() == [] and not engine.has_unfinished()


def test_nothing_is_sent_beyond_the_budget_and_parked_work_goes_out_when_it_grows(server: FakeServer) -> None:
    server.metrics_running = 8  # the server looks full of online work: the budget falls to its floor of 0
    engine = start(server, min_inflight=0)
    try:
        wait_for(lambda: engine.dispatch_limit() == 0)
        for i in range(3):
            engine.add(chat(f"r{i}"))
        assert engine.step() == [] and not server.bodies
        assert engine.stats().waiting == 3
        server.metrics_running = None  # the online work is gone: the budget grows and the parked requests go out
        assert sorted(r.request_id for r in drain(engine)) == ["r0", "r1", "r2"]
    finally:
        engine.close()


def test_online_requests_waiting_make_the_youngest_batch_call_yield_and_run_again_later(server: FakeServer) -> None:
    engine = start(server, min_inflight=0)
    try:
        wait_for(lambda: engine.dispatch_limit() >= 2)
        engine.add(chat("old", "hold:old"))
        time.sleep(0.05)
        engine.add(chat("young", "hold:young"))
        wait_for(lambda: server.running == 2)
        server.metrics_running, server.waiting = 8, 1  # the server fills with online work; one request queues
        wait_for(lambda: server.cancelled == ["hold:young"], engine)
        wait_for(lambda: server.running == 2, engine)  # the budget grew again and "young" went out anew
        engine._run(_release(server))
        results = drain(engine)
        assert sorted(r.request_id for r in results) == ["old", "young"]
        assert all(r.status_code == 200 for r in results)
        assert (server.calls["hold:old"], server.calls["hold:young"]) == (1, 2)
        assert server.cancelled == ["hold:young"] and engine.stats().extra["yields"] == 1
    finally:
        engine.close()


def test_while_the_server_cannot_be_read_nothing_new_is_sent_and_nothing_fails(
    engine: HttpEngine, server: FakeServer
) -> None:
    server.metrics_down = True
    wait_for(lambda: engine.dispatch_limit() == 0)
    engine.add(chat("r1"))
    assert engine.step() == [] and not server.bodies and engine.has_unfinished()
    server.metrics_down = False
    (result,) = drain(engine)
    assert result.status_code == 200 and server.calls["ok"] == 1


async def _release(server: FakeServer) -> None:
    server.release.set()


def drain_until(engine: HttpEngine, count: int) -> list[EngineResult]:
    results: list[EngineResult] = []
    until = time.monotonic() + 10
    while len(results) < count:
        assert time.monotonic() < until
        results.extend(engine.step())
    return results


def wait_for(condition: Any, engine: HttpEngine | None = None, seconds: float = 10.0) -> None:
    until = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < until, "timed out"
        if engine is not None:
            assert engine.step() == []
        else:
            time.sleep(0.01)


def test_a_responses_request_goes_to_the_chat_endpoint_and_comes_back_as_a_response(
    engine: HttpEngine, server: FakeServer
) -> None:
    server.cached_tokens = 4
    body = {"model": "backfill-demo", "input": [{"role": "user", "content": "ok"}], "max_output_tokens": 3}
    assert engine.add(EngineRequest("r1", "/v1/responses", {**body, "metadata": {"k": "v"}})) is None
    (result,) = drain(engine)
    assert server.paths == [CHAT] and server.bodies[0]["messages"] == [{"role": "user", "content": "ok"}]
    assert server.bodies[0]["max_tokens"] == 3 and "input" not in server.bodies[0]
    response = Response.model_validate(result.body)
    assert response.object == "response" and response.model == "backfill-demo" and response.output_text == "x y"
    assert response.usage and response.usage.input_tokens == 7 and response.usage.output_tokens == 3
    assert response.usage.input_tokens_details.cached_tokens == 4 == result.cached_tokens
    assert response.metadata == {"k": "v"} and response.status == "incomplete"  # finish_reason "length"


def test_chat_usage_carries_the_servers_cached_tokens_or_zero(engine: HttpEngine, server: FakeServer) -> None:
    engine.add(chat("plain"))
    (plain,) = drain(engine)
    server.cached_tokens = 5
    engine.add(chat("cached"))
    (cached,) = drain(engine)
    assert plain.body["usage"]["prompt_tokens_details"] == {"cached_tokens": 0} and plain.cached_tokens == 0
    assert cached.body["usage"]["prompt_tokens_details"] == {"cached_tokens": 5} and cached.cached_tokens == 5
    ChatCompletion.model_validate(cached.body)


def test_an_output_cap_beyond_the_servers_context_is_refused_without_a_call(
    engine: HttpEngine, server: FakeServer
) -> None:
    refused = engine.add(chat("r1", max_tokens=10_000_000))
    assert refused is not None and refused.status_code == 400 and refused.error_code == "context_length_exceeded"
    assert refused.error_message and refused.error_message.startswith("This model's maximum context length is 1024")
    assert not server.bodies and not engine.has_unfinished()


def test_a_cap_that_fits_only_without_the_prompt_is_a_400_once_the_server_counted_it(
    engine: HttpEngine, server: FakeServer
) -> None:
    engine.add(chat("r1", max_tokens=1020))  # the server clamps it; OpenAI refuses 7 + 1020 > 1024
    (result,) = drain(engine)
    assert result.status_code == 400 and result.error_code == "context_length_exceeded"
    assert "1027 tokens (7 in the messages, 1020 in the completion)" in (result.error_message or "")
    assert (result.prompt_tokens, result.completion_tokens) == (0, 0)  # not billed


def test_an_anthropic_messages_request_goes_out_as_chat_and_comes_back_as_a_message(server: FakeServer) -> None:
    from anthropic.types import Message

    paths: list[str] = []

    async def handle(request: httpx.Request) -> httpx.Response:
        paths.append(request.url.path)
        return await server.handle(request)

    engine = HttpEngine("backfill-demo", spec(), transport=httpx.MockTransport(handle))
    try:
        params = {
            "model": "backfill-demo",
            "max_tokens": 3,
            "messages": [{"role": "user", "content": "ok"}, {"role": "assistant", "content": "Sure,"}],
            "top_k": 5,
            "stop_sequences": ["END"],
        }
        assert engine.add(EngineRequest("m1", "/v1/messages", params)) is None
        assert engine.add(EngineRequest("m2", "/v1/messages", {**params, "tools": [{"name": "x"}]})) is not None
        (result,) = drain(engine)
    finally:
        engine.close()
    sent = server.bodies[0]
    assert CHAT in paths and "/v1/messages" not in paths
    assert sent["top_k"] == 5 and sent["stop"] == ["END"] and sent["continue_final_message"] is True
    assert "stop_sequences" not in sent and sent["priority"] == 1_000_000
    message = Message.model_validate(result.body)
    assert message.model == "backfill-demo" and message.stop_reason == "max_tokens" and message.content[0].text == "x y"
    assert (message.usage.input_tokens, message.usage.output_tokens) == (7, 3)
    assert (result.prompt_tokens, result.completion_tokens) == (7, 3)


def test_with_prefill_pacing_and_no_step_time_yet_one_batch_request_is_on_the_server_at_a_time(
    server: FakeServer,
) -> None:
    engine = start(server, min_inflight=0, batch_prefill_tokens_per_step=4)  # this /metrics has no latency counters
    try:
        wait_for(lambda: engine.dispatch_limit() >= 3)
        for i in range(3):
            engine.add(chat(f"r{i}", "hold:paced"))
        wait_for(lambda: server.running == 1, engine)
        time.sleep(0.05)
        assert engine.step() == [] and server.running == 1 and engine.stats().waiting == 2
        assert engine.dispatch_limit() == min(engine.budget.limit, 1 + http_engine.PACED_AHEAD)  # few rows held back
        engine._run(_release(server))
        assert sorted(r.request_id for r in drain_until(engine, 3)) == ["r0", "r1", "r2"]
        assert server.calls["hold:paced"] == 3
    finally:
        engine.close()


def test_the_floor_goes_out_whatever_the_prefill_pace(server: FakeServer) -> None:
    engine = start(server, min_inflight=3, batch_prefill_tokens_per_step=4)
    try:
        for i in range(3):
            engine.add(chat(f"r{i}", "hold:floor"))
        wait_for(lambda: server.running == 3, engine)
        engine._run(_release(server))
        assert len(drain_until(engine, 3)) == 3
    finally:
        engine.close()
