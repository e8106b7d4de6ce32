"""Resuming generations from checkpoints on the real vLLM engine (tiny demo model, greedy decoding).

A request interrupted after k decode steps is aborted, its generated ids go through the checkpoint's packing,
and it is submitted again with them: the answer (text, finish reason, usage) must equal the uninterrupted
one, including a stop string whose first characters were generated before the interruption.
"""

from __future__ import annotations

from typing import Any

import pytest

from storage.queue.checkpoints import pack_tokens, unpack_tokens
from worker.engine import EngineRequest, EngineResult
from worker.engine.vllm_engine import VllmEngine
from worker.engine.vllm_resume import stream_decoder
from worker.engine.wire import parse

pytestmark = pytest.mark.vllm

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
PROMPTS = ["class Foo(object):\n    def", "The quick brown fox", "x = [1, 2, 3]\nprint(x)"]


def request(rid: str, prompt: str, *, resume: tuple[int, ...] = (), **extra: Any) -> EngineRequest:
    body = {"model": "backfill-demo", "max_tokens": 48, "temperature": 0, "ignore_eos": True, **extra}
    if rid.startswith("cmpl"):
        return EngineRequest(rid, COMPLETIONS, {**body, "prompt": prompt}, resume)
    return EngineRequest(rid, CHAT, {**body, "messages": [{"role": "user", "content": prompt}]}, resume)


def run(engine: VllmEngine, requests: list[EngineRequest]) -> dict[str, EngineResult]:
    for item in requests:
        assert engine.add(item) is None
    results: dict[str, EngineResult] = {}
    for _ in range(3000):
        if not engine.has_unfinished():
            return results
        results.update((result.request_id, result) for result in engine.step())
    raise AssertionError("the engine never finished")


def interrupted(engine: VllmEngine, requests: list[EngineRequest], steps: int) -> dict[str, tuple[int, ...]]:
    """Run `steps` steps, then hand back: the checkpoints (packed and unpacked, as storage keeps them)."""
    for item in requests:
        assert engine.add(item) is None
    for _ in range(steps):
        assert engine.step() == []  # nothing finishes this early
    progress = engine.progress([item.request_id for item in requests])
    engine.abort([item.request_id for item in requests])
    assert all(p.exact for p in progress.values())
    return {rid: tuple(unpack_tokens(pack_tokens(p.token_ids))) for rid, p in progress.items()}


def answer(result: EngineResult) -> dict[str, Any]:
    assert result.ok, result.body
    return {"choices": result.body["choices"], "usage": result.body["usage"], "tokens": result.completion_tokens}


def test_greedy_generations_resumed_at_several_points_answer_exactly_as_uninterrupted_ones(
    vllm_chat_engine: VllmEngine,
) -> None:
    engine = vllm_chat_engine
    # As many as the engine runs at once (4), so each has decoded exactly `steps` tokens when interrupted.
    originals = [request("chat-0", PROMPTS[0]), request("chat-1", PROMPTS[1])]
    originals += [request("cmpl-1", PROMPTS[1]), request("cmpl-2", PROMPTS[2])]
    reference = {rid: answer(result) for rid, result in run(engine, originals).items()}
    for steps in (1, 9, 30):
        again = [request(f"{item.request_id}@{steps}", "") for item in originals]
        fresh = [EngineRequest(new.request_id, item.url, item.body) for new, item in zip(again, originals, strict=True)]
        checkpoints = interrupted(engine, fresh, steps)
        assert {len(ids) for ids in checkpoints.values()} == {steps}
        resumed = [EngineRequest(item.request_id, item.url, item.body, checkpoints[item.request_id]) for item in fresh]
        results = run(engine, resumed)
        for item in fresh:
            assert answer(results[item.request_id]) == reference[item.request_id.split("@")[0]], (steps, item)


def spanning_stop(engine: VllmEngine) -> tuple[str, str, int]:
    """A prompt and a 4-character stop string its uninterrupted generation first completes across token k -> k+1
    (the first of PROMPTS whose random-weight answer has one)."""
    for prompt in PROMPTS:
        found = spanning_stop_of(engine, prompt)
        if found is not None:
            return prompt, *found
    pytest.skip("the demo model's greedy answers to PROMPTS have no spanning stop string")


def spanning_stop_of(engine: VllmEngine, prompt: str) -> tuple[str, int] | None:
    """A 4-character stop string the uninterrupted generation of `prompt` first completes across k -> k+1."""
    (result,) = run(engine, [request("probe", prompt)]).values()
    assert result.ok
    probe = EngineRequest("probe-ids", CHAT, request("x", prompt).body)
    ids = list(interrupted(engine, [probe], 40)["probe-ids"])
    rendered = engine._prepare("ids", parse(probe.url, probe.body).generation)[0][1]["prompt_token_ids"]
    decode = stream_decoder(engine._tokenizer, rendered)  # the text vLLM would show for these ids
    for k in range(2, len(ids) - 1):
        old, full = decode(ids[:k]), decode(ids[: k + 1])
        stop = old[-2:] + full[len(old) : len(old) + 2]
        if len(stop) == 4 and full.find(stop) == len(old) - 2:
            return stop, k
    return None


def test_a_stop_string_begun_before_the_interruption_still_stops_the_resumed_generation(
    vllm_chat_engine: VllmEngine,
) -> None:
    engine = vllm_chat_engine
    prompt, stop, k = spanning_stop(engine)
    original = request("stop-ref", prompt, stop=[stop])
    reference = answer(run(engine, [original])["stop-ref"])
    assert reference["choices"][0]["finish_reason"] == "stop" and reference["tokens"] == k + 1
    for steps in (k, k - 1):  # the match spans the boundary; then lies wholly in the resumed part
        fresh = EngineRequest(f"stop-{steps}", CHAT, original.body)
        checkpoint = interrupted(engine, [fresh], steps)[fresh.request_id]
        resumed = EngineRequest(fresh.request_id, CHAT, original.body, checkpoint)
        assert answer(run(engine, [resumed])[fresh.request_id]) == reference, steps


def test_a_step_checks_only_resumed_requests_a_stop_string_may_still_span(vllm_chat_engine: VllmEngine) -> None:
    """The per-step boundary check visits the resumed requests whose stop string could still span the
    hand-back, not every request in flight, and lets go of each once its window closes or it ends."""
    engine = vllm_chat_engine
    body = request("x", PROMPTS[0], stop=["@@@@"]).body
    checkpoint = interrupted(engine, [EngineRequest("watched", CHAT, body)], 5)["watched"]
    plain = [EngineRequest(f"plain-{i}", CHAT, body) for i in range(3)]
    for item in [*plain, EngineRequest("watched", CHAT, body, checkpoint)]:
        assert engine.add(item) is None
    assert set(engine._open_windows) == {"watched"}
    results = {}
    while engine.has_unfinished():
        results.update((result.request_id, result) for result in engine.step())
    assert sorted(results) == ["plain-0", "plain-1", "plain-2", "watched"]
    assert all(result.ok and result.completion_tokens == 48 for result in results.values())
    assert engine._open_windows == {}
