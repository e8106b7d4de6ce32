"""The fake engines resume exactly: a request continued from its generated ids answers as if never interrupted."""

from __future__ import annotations

from typing import Any

import pytest

from worker.engine import EngineRequest, EngineResult
from worker.engine.fake import FakeEngine
from worker.engine.timed_fake import TimedFakeEngine


def chat(rid: str, resume: tuple[int, ...] = (), **extra: Any) -> EngineRequest:
    body = {"model": "m", "messages": [{"role": "user", "content": "hello there"}], "max_tokens": 20, **extra}
    return EngineRequest(rid, "/v1/chat/completions", body, resume)


def run(engine: FakeEngine, request: EngineRequest) -> tuple[EngineResult, int]:
    assert engine.add(request) is None
    for steps in range(1, 1000):
        if results := engine.step():
            return results[0], steps
    raise AssertionError("never finished")


def interrupt(engine: FakeEngine, request: EngineRequest, steps: int) -> tuple[int, ...]:
    assert engine.add(request) is None
    for _ in range(steps):
        assert engine.step() == []
    progress = engine.progress([request.request_id])[request.request_id]
    engine.abort([request.request_id])
    assert progress.exact
    return tuple(progress.token_ids)


@pytest.mark.parametrize("make", [lambda: FakeEngine(), lambda: TimedFakeEngine(max_num_seqs=4, timed=False)])
def test_a_resumed_request_answers_as_the_uninterrupted_one_in_fewer_steps(make: Any) -> None:
    reference, steps = run(make(), chat("r1"))
    engine = make()
    done = interrupt(engine, chat("r1"), 8)
    resumed, more = run(engine, chat("r1", done))
    assert resumed.body["choices"] == reference.body["choices"] and resumed.body["usage"] == reference.body["usage"]
    assert more < steps


def test_a_wrong_checkpoint_shows_in_the_text() -> None:
    reference, _ = run(FakeEngine(), chat("r1"))
    resumed, _ = run(FakeEngine(), chat("r1", (7,) * 8))
    assert resumed.body["choices"] != reference.body["choices"]


def test_requests_that_cannot_resume_exactly_restart_and_say_so() -> None:
    engine = FakeEngine()
    interrupt_progress = []
    for rid, extra in (("seeded", {"seed": 3}), ("two", {"n": 2}), ("penalty", {"frequency_penalty": 0.5})):
        assert engine.add(chat(rid, **extra)) is None
        interrupt_progress.append(rid)
    engine.step()
    assert {rid: p.exact for rid, p in engine.progress(interrupt_progress).items()} == dict.fromkeys(
        interrupt_progress, False
    )
    engine.abort(interrupt_progress)
    assert engine.add(chat("seeded", (1, 2, 3), seed=3)) is None
    assert engine.progress(["seeded"])["seeded"].token_ids == []  # restarted: the checkpoint is not used
