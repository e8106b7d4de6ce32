"""The real vLLM adapter rendering chat requests ahead on another thread (worker/engine/vllm_ahead.py)."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from storage.endpoints import MESSAGES_URL as MESSAGES
from tests.e2e.worker.engine.test_vllm_engine import CHAT, chat, run_all
from worker.engine import EngineRequest
from worker.engine.vllm_engine import VllmEngine

pytestmark = pytest.mark.vllm


def greedy(rid: str, topic: str, **extra: Any) -> EngineRequest:
    body = {"model": "m", "messages": [{"role": "user", "content": f"Tell me about {topic}."}], "temperature": 0}
    return EngineRequest(rid, CHAT, {**body, "max_tokens": 8, **extra})


def test_a_chat_rendered_ahead_answers_as_one_rendered_by_add(vllm_chat_engine: VllmEngine) -> None:
    engine = vllm_chat_engine
    ahead = [greedy("ahead-1", "tea"), greedy("ahead-2", "rivers", n=2, temperature=1.0, seed=7, logprobs=True)]
    thread = threading.Thread(target=engine.prepare, args=(ahead,), name="claimer")
    thread.start()
    thread.join()
    plain = [greedy("plain-1", "tea"), greedy("plain-2", "rivers", n=2, temperature=1.0, seed=7, logprobs=True)]
    results, _ = run_all(engine, ahead + plain)
    for i in (1, 2):
        got, expected = results[f"ahead-{i}"], results[f"plain-{i}"]
        assert got.status_code == expected.status_code == 200, got.body
        assert got.body["choices"] == expected.body["choices"]
        assert got.body["usage"] == expected.body["usage"]


def message(rid: str, *, prefill: bool = False) -> EngineRequest:
    turns = [{"role": "user", "content": [{"type": "text", "text": "Name a river."}, {"type": "text", "text": "One."}]}]
    turns += [{"role": "assistant", "content": "The"}] if prefill else []
    body = {"model": "m", "max_tokens": 6, "system": "Be terse.", "messages": turns, "temperature": 0, "top_k": 5}
    return EngineRequest(rid, MESSAGES, body)


def test_an_anthropic_message_rendered_ahead_answers_as_one_rendered_by_add(vllm_chat_engine: VllmEngine) -> None:
    engine = vllm_chat_engine
    engine.prepare([message("m-ahead"), message("p-ahead", prefill=True)])
    requests = [message("m-ahead"), message("m-plain"), message("p-ahead", prefill=True)]
    results, _ = run_all(engine, [*requests, message("p-plain", prefill=True)])
    for name in ("m", "p"):  # a prefill continues the assistant's turn: rendered by add, on the engine's thread
        got, expected = results[f"{name}-ahead"], results[f"{name}-plain"]
        assert got.status_code == expected.status_code == 200, got.body
        assert got.body["content"] == expected.body["content"] and got.body["usage"] == expected.body["usage"]
        assert got.body["stop_reason"] == expected.body["stop_reason"]


def test_add_submits_what_was_rendered_ahead_without_rendering_again(
    vllm_chat_engine: VllmEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = vllm_chat_engine
    engine.prepare([greedy("pre", "salt"), message("pre-message")])

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("the engine thread rendered")

    monkeypatch.setattr(engine, "_direct", None)
    monkeypatch.setattr(engine, "_render", broken)
    monkeypatch.setattr(engine._renderer, "render_chat", broken)  # the Anthropic path's renderer
    results, _ = run_all(engine, [greedy("pre", "salt"), greedy("not-pre", "salt"), message("pre-message")])
    assert results["pre"].status_code == 200 and results["pre"].completion_tokens == 8
    assert results["pre-message"].status_code == 200 and results["pre-message"].completion_tokens == 6
    assert results["not-pre"].status_code == 400  # rendered by add: the broken renderer


def test_a_bad_request_rendered_ahead_fails_at_add_as_it_would_have(vllm_chat_engine: VllmEngine) -> None:
    engine = vllm_chat_engine
    too_long = {"max_tokens": 10**6}
    engine.prepare([greedy("bad-ahead", "x", **too_long), EngineRequest("junk-ahead", CHAT, {"messages": 3})])
    results, finished = run_all(
        engine,
        [
            greedy("bad-ahead", "x", **too_long),
            greedy("bad-plain", "x", **too_long),
            EngineRequest("junk-ahead", CHAT, {"messages": 3}),
            EngineRequest("junk-plain", CHAT, {"messages": 3}),
        ],
    )
    for name in ("bad", "junk"):
        got, expected = results[f"{name}-ahead"], results[f"{name}-plain"]
        assert got.status_code == expected.status_code == 400 and finished[f"{name}-ahead"] == 0
        assert got.error_code == expected.error_code and got.error_message == expected.error_message


def test_rendering_ahead_while_the_engine_decodes_loses_nothing(vllm_chat_engine: VllmEngine) -> None:
    """The claimer renders with a tokenizer of its own while the engine thread detokenizes with its one."""
    engine = vllm_chat_engine
    waves = [[chat(f"wave{w}-{i}", max_tokens=6) for i in range(16)] for w in range(8)]
    results: dict[str, int] = {}
    ready = [threading.Event() for _ in waves]

    def claimer() -> None:
        for wave, done in zip(waves, ready, strict=True):
            engine.prepare(wave)
            done.set()

    thread = threading.Thread(target=claimer, name="claimer")
    thread.start()
    for wave, done in zip(waves, ready, strict=True):
        for request in wave[:8]:  # half before its render is sure to be there, half after
            assert engine.add(request) is None
        done.wait(timeout=60)
        for request in wave[8:]:
            assert engine.add(request) is None
        for _ in range(3):  # decode while the claimer renders the next wave
            results.update((r.request_id, r.completion_tokens) for r in engine.step())
    thread.join()
    while engine.has_unfinished():
        results.update((r.request_id, r.completion_tokens) for r in engine.step())
    assert results == {request.request_id: 6 for wave in waves for request in wave}
