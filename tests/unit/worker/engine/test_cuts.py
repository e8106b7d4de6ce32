"""Answers cut short at expiry: each wire format renders what was generated so far as its own "ran out of tokens"
stop, which the official SDKs parse, marked `backfill.cut_by` so it reads apart from a real length stop."""

from __future__ import annotations

from typing import Any

import anthropic.types
import openai.types
import openai.types.chat
import openai.types.responses
import pytest

from worker.engine import EngineRequest
from worker.engine.cuts import cut_answer
from worker.engine.fake import FakeEngine
from worker.engine.generation import Output
from worker.engine.wire import parse

CHAT = {"model": "m", "messages": [{"role": "user", "content": "tell me"}], "max_tokens": 50}


def cut(url: str, body: dict[str, Any], *, text: str = "Once upon a", tokens: int = 3) -> dict[str, Any]:
    output = Output("r1", response_id="abc", prompt_tokens=7)
    answer = cut_answer(parse(url, body), output, text=text, token_count=tokens, model="m")
    assert answer is not None and answer.status_code == 200
    assert (answer.prompt_tokens, answer.completion_tokens) == (7, tokens)
    return answer.body


def test_a_cut_chat_answer_is_a_length_stop_the_sdk_parses_with_the_text_so_far() -> None:
    body = cut("/v1/chat/completions", CHAT)
    completion = openai.types.chat.ChatCompletion.model_validate(body)
    assert completion.choices[0].finish_reason == "length"
    assert completion.choices[0].message.content == "Once upon a"
    assert completion.usage is not None and completion.usage.completion_tokens == 3
    assert completion.usage.prompt_tokens == 7
    assert (completion.model_extra or {})["backfill"] == {"cut_by": "expiry"}


def test_a_cut_completion_is_a_length_stop() -> None:
    body = cut("/v1/completions", {"model": "m", "prompt": "tell me", "max_tokens": 50})
    completion = openai.types.Completion.model_validate(body)
    assert completion.choices[0].finish_reason == "length" and completion.choices[0].text == "Once upon a"
    assert body["backfill"] == {"cut_by": "expiry"}


def test_a_cut_response_is_incomplete_for_max_output_tokens() -> None:
    body = cut("/v1/responses", {"model": "m", "input": "tell me", "max_output_tokens": 50})
    response = openai.types.responses.Response.model_validate(body)
    assert response.status == "incomplete"
    assert response.incomplete_details is not None and response.incomplete_details.reason == "max_output_tokens"
    assert response.output_text == "Once upon a"
    assert body["backfill"] == {"cut_by": "expiry"}


def test_a_cut_anthropic_message_stops_on_max_tokens_though_short_of_them() -> None:
    body = cut("/v1/messages", {"model": "m", "max_tokens": 50, "messages": [{"role": "user", "content": "hi"}]})
    message = anthropic.types.Message.model_validate(body)
    assert message.stop_reason == "max_tokens"  # not model_context_window_exceeded: the window, not the context
    assert message.content[0].type == "text" and message.content[0].text == "Once upon a"
    assert message.usage.output_tokens == 3
    assert body["backfill"] == {"cut_by": "expiry"}


@pytest.mark.parametrize(
    ("url", "body"),
    [
        ("/v1/chat/completions", {**CHAT, "n": 2}),
        ("/v1/embeddings", {"model": "m", "input": "x"}),
        (
            "/v1/chat/completions",
            {
                **CHAT,
                "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
                "tool_choice": {"type": "function", "function": {"name": "f"}},
            },
        ),
    ],
)
def test_nothing_partial_to_show_gives_no_answer(url: str, body: dict[str, Any]) -> None:
    assert cut_answer(parse(url, body), Output("r1"), text="x", token_count=1, model="m") is None


def test_no_token_yet_gives_no_answer() -> None:
    assert cut_answer(parse("/v1/chat/completions", CHAT), Output("r1"), text="", token_count=0, model="m") is None


def test_the_fake_engine_cuts_a_running_request_to_the_tokens_it_decoded_and_drops_it() -> None:
    engine = FakeEngine()
    for rid in ("a", "b"):
        assert engine.add(EngineRequest(rid, "/v1/chat/completions", CHAT)) is None
    for _ in range(5):
        assert engine.step() == []
    (answer,) = engine.cut(["a"])
    choice = answer.body["choices"][0]
    assert choice["finish_reason"] == "length" and len(choice["message"]["content"].split()) == 5
    assert answer.completion_tokens == 5 and answer.body["backfill"] == {"cut_by": "expiry"}
    assert set(engine.progress(["a", "b"])) == {"b"}  # a is gone, b runs on
