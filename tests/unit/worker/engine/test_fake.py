"""The fake engine keeps vLLM's continuous-batching contract and answers in OpenAI's shapes."""

from __future__ import annotations

import base64
import struct
from typing import Any

import pytest
from openai.types import Completion, CreateEmbeddingResponse
from openai.types.chat import ChatCompletion

from worker.engine import Engine, EngineRequest, EngineResult
from worker.engine.fake import EMBEDDING_DIMENSIONS, FakeEngine

CHAT = "/v1/chat/completions"


def chat(request_id: str, max_tokens: int | None = 4, **extra: Any) -> EngineRequest:
    body: dict[str, Any] = {"model": "fake-model", "messages": [{"role": "user", "content": "two words"}], **extra}
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    return EngineRequest(request_id, CHAT, body)


def drain(engine: FakeEngine) -> dict[str, tuple[EngineResult, int]]:
    """Step until idle; each result with the step number it finished on."""
    finished: dict[str, tuple[EngineResult, int]] = {}
    while engine.has_unfinished():
        for result in engine.step():
            finished[result.request_id] = (result, engine.steps)
    return finished


def test_the_fake_satisfies_the_engine_protocol() -> None:
    engine: Engine = FakeEngine()
    assert engine.max_num_seqs == 4 and engine.model_name == "fake-model"


def test_a_request_decodes_one_token_per_step_and_finishes_after_max_tokens() -> None:
    engine = FakeEngine()
    assert engine.add(chat("a", max_tokens=5)) is None
    finished = drain(engine)
    result, step = finished["a"]
    assert step == 5 and result.ok and result.completion_tokens == 5 and result.prompt_tokens > 0
    body = ChatCompletion.model_validate(result.body)
    assert body.usage and body.usage.completion_tokens == 5 and body.choices[0].finish_reason == "length"
    assert len((body.choices[0].message.content or "").split()) == 5


def test_max_completion_tokens_wins_and_the_default_is_16() -> None:
    engine = FakeEngine()
    engine.add(chat("explicit", max_tokens=9, max_completion_tokens=3))
    engine.add(chat("default", max_tokens=None))
    finished = drain(engine)
    assert finished["explicit"][0].completion_tokens == 3
    assert finished["default"][0].completion_tokens == 16


def test_at_most_max_num_seqs_run_and_the_rest_wait_in_fifo_order() -> None:
    engine = FakeEngine(max_num_seqs=2)
    for i in range(5):
        engine.add(chat(f"r{i}", max_tokens=3))
    assert (engine.stats().running, engine.stats().waiting) == (0, 5)
    engine.step()
    assert (engine.stats().running, engine.stats().waiting) == (2, 3)
    finished = drain(engine)
    assert [finished[f"r{i}"][1] for i in range(5)] == [3, 3, 6, 6, 9]


def test_a_long_answer_does_not_hold_back_short_ones() -> None:
    engine = FakeEngine(max_num_seqs=2)
    engine.add(chat("long", max_tokens=200))
    for i in range(4):
        engine.add(chat(f"short{i}", max_tokens=2))
    finished = drain(engine)
    assert max(finished[f"short{i}"][1] for i in range(4)) == 8
    assert finished["long"][1] == 200


def test_abort_frees_the_slot_and_yields_no_result() -> None:
    engine = FakeEngine(max_num_seqs=1)
    engine.add(chat("running", max_tokens=50))
    engine.add(chat("waiting", max_tokens=50))
    engine.add(chat("next", max_tokens=2))
    engine.step()
    engine.abort(["running", "waiting", "unknown"])
    assert (engine.stats().running, engine.stats().waiting) == (0, 1)
    finished = drain(engine)
    assert list(finished) == ["next"]


@pytest.mark.parametrize(
    ("request_", "code", "param"),
    [
        (chat("x", tools=[{"type": "function", "function": {"name": "f"}}]), "unsupported_parameter", "tool_choice"),
        (chat("x", tools=[{"type": "web_search_preview"}]), "unsupported_tool", "tools[0]"),
        (chat("x", stream=True), "unsupported_parameter", "stream"),
        (chat("x", frobnicate=1), "unsupported_parameter", "frobnicate"),
        (chat("x", temperature="hot"), "invalid_value", "temperature"),
        (chat("x", n=1000), "invalid_value", "n"),
        (chat("x", messages=[{"role": "user", "content": "word " * 3000}]), "context_length_exceeded", "messages"),
        (chat("x", max_tokens=2, min_tokens=5), "invalid_value", "min_tokens"),
        (EngineRequest("x", "/v1/completions", {"model": "m", "prompt": ["a", "b"]}), "invalid_value", "prompt"),
        (EngineRequest("x", "/v1/embeddings", {"model": "m", "input": "hi"}), "unsupported_endpoint", "url"),
        (EngineRequest("x", "/v1/images", {"model": "m"}), "unsupported_endpoint", "url"),
        (EngineRequest("x", CHAT, {"model": "m"}), "missing_required_parameter", "messages"),
    ],
)
def test_a_body_that_cannot_run_is_refused_with_a_400(request_: EngineRequest, code: str, param: str) -> None:
    engine = FakeEngine()
    engine.add(chat("good", max_tokens=2))
    result = engine.add(request_)
    assert result is not None and result.status_code == 400 and result.error_code == code
    assert result.body["error"]["param"] == param and result.body["error"]["type"] == "invalid_request_error"
    assert list(drain(engine)) == ["good"]


def test_spelling_out_a_default_is_not_an_error() -> None:
    engine = FakeEngine()
    assert engine.add(chat("x", stream=False, tools=[], tool_choice="none", user="u", ignore_eos=True)) is None


def test_completions_answer_as_text_completion_with_n_choices() -> None:
    engine = FakeEngine()
    engine.add(EngineRequest("p", "/v1/completions", {"model": "m", "prompt": [5, 6, 7], "n": 3}))
    result, _ = drain(engine)["p"]
    body = Completion.model_validate(result.body)
    assert body.object == "text_completion" and len(body.choices) == 3
    assert result.prompt_tokens == 3 and result.completion_tokens == 3 * 16
    assert body.usage and body.usage.total_tokens == 3 + 48


def test_embeddings_answer_as_a_list_in_float_or_base64() -> None:
    engine = FakeEngine(runner="pooling")
    engine.add(EngineRequest("f", "/v1/embeddings", {"model": "m", "input": ["a b", "c"]}))
    engine.add(EngineRequest("b", "/v1/embeddings", {"model": "m", "input": ["a b", "c"], "encoding_format": "base64"}))
    finished = drain(engine)
    floats = CreateEmbeddingResponse.model_validate(finished["f"][0].body)
    assert [d.index for d in floats.data] == [0, 1] and floats.usage.prompt_tokens == 3
    encoded = finished["b"][0].body["data"][0]["embedding"]
    decoded = struct.unpack(f"<{EMBEDDING_DIMENSIONS}f", base64.b64decode(encoded))
    assert decoded == pytest.approx(floats.data[0].embedding, abs=1e-6)
    assert engine.add(chat("c")) is not None


def test_fail_request_ids_finish_with_a_500() -> None:
    engine = FakeEngine(fail_request_ids={"bad"})
    engine.add(chat("bad"))
    engine.add(chat("good"))
    finished = drain(engine)
    assert finished["bad"][0].status_code == 500 and finished["bad"][0].body["error"]["type"] == "server_error"
    assert finished["good"][0].ok


def test_duplicate_request_ids_in_flight_are_refused() -> None:
    engine = FakeEngine()
    engine.add(chat("same"))
    result = engine.add(chat("same"))
    assert result is not None and result.error_code == "duplicate_request"


def test_answers_are_deterministic() -> None:
    def answer() -> dict[str, Any]:
        engine = FakeEngine()
        engine.add(chat("same", max_tokens=7))
        body = drain(engine)["same"][0].body
        return {k: v for k, v in body.items() if k != "created"}

    assert answer() == answer()
