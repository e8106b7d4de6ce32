"""Requests rendered ahead on another thread (worker/engine/vllm_ahead.py): taken once, bounded, never raising."""

from __future__ import annotations

import time
from typing import Any

from worker.engine import EngineRequest
from worker.engine.vllm_ahead import Ahead, AheadRenders
from worker.engine.vllm_chat import DirectChat

CHAT = "/v1/chat/completions"


def request(rid: str, *, resume: tuple[int, ...] = (), content: str = "hi") -> EngineRequest:
    body = {"model": "m", "messages": [{"role": "user", "content": content}]}
    return EngineRequest(rid, CHAT, body, resume_token_ids=resume)


def build(req: EngineRequest, direct: Any) -> Ahead | None:
    content = req.body["messages"][0]["content"]
    if content == "boom":
        raise ValueError("a body the engine thread must report")
    if content == "later":
        return None  # left for `add`
    prompt = {"prompt_token_ids": [ord(c) for c in content], "arrival_time": 0.0}
    return Ahead(req.body, [(req.request_id, prompt, {"max_tokens": 4})], exact=True)


class Tokenizer:
    def encode(self, text: str, *, add_special_tokens: bool) -> list[int]:
        return [ord(c) for c in text]


def renders(capacity: int = 8) -> AheadRenders:
    return AheadRenders(DirectChat(Tokenizer(), max_model_len=100), build, capacity=capacity)


def test_a_render_is_taken_once_and_arrives_when_taken() -> None:
    ahead = renders()
    ahead.prepare([request("a", content="abc")])
    before = time.time()
    got = ahead.take("a")
    assert got is not None and got.prepared[0][0] == "a"
    assert got.prepared[0][1]["prompt_token_ids"] == [97, 98, 99]
    assert got.prepared[0][1]["arrival_time"] >= before  # not when the claimer rendered it
    assert ahead.take("a") is None and ahead.take("never-prepared") is None


def test_resumed_failing_and_declined_requests_are_left_for_add() -> None:
    ahead = renders()
    ahead.prepare([request("r", resume=(5, 6)), request("b", content="boom"), request("l", content="later")])
    ahead.prepare([request("ok")])  # an error on one request stops nothing
    assert len(ahead) == 1
    assert ahead.take("r") is None and ahead.take("b") is None and ahead.take("l") is None
    assert ahead.take("ok") is not None


def test_renders_no_one_takes_are_dropped_oldest_first_beyond_capacity() -> None:
    ahead = renders(capacity=3)
    ahead.prepare([request(f"r{i}") for i in range(5)])
    assert len(ahead) == 3
    assert ahead.take("r0") is None and ahead.take("r1") is None
    assert all(ahead.take(f"r{i}") is not None for i in (2, 3, 4))


def test_renders_passed_over_by_a_later_take_are_dropped() -> None:
    ahead = renders()
    ahead.prepare([request(f"r{i}") for i in range(4)])  # the engine thread skips r0 and r1 (still in the engine)
    assert ahead.take("r2") is not None
    assert len(ahead) == 1 and ahead.take("r0") is None and ahead.take("r1") is None
    assert ahead.take("r3") is not None


def test_a_row_rendered_again_takes_its_new_place_so_renders_it_passed_are_dropped() -> None:
    ahead = renders()
    ahead.prepare([request("r0"), request("r1"), request("r2")])
    ahead.prepare([request("r0", content="again")])  # r0 claimed back, then claimed again after r2
    assert ahead.take("r2") is not None  # passes r1 (never to be taken), not r0's newer render
    assert len(ahead) == 1
    got = ahead.take("r0")
    assert got is not None and got.prepared[0][1]["prompt_token_ids"] == [ord(c) for c in "again"]
