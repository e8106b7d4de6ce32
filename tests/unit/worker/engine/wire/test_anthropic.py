"""Anthropic Messages bodies: what runs, what is refused (and how it reads), and the Message that comes back.

Every answer is re-parsed with the official `anthropic` SDK's own types.
"""

from __future__ import annotations

from typing import Any

import pytest
from anthropic.types import Message

from storage.endpoints import MESSAGES_URL
from worker.engine import EngineRequest
from worker.engine.fake import FakeEngine
from worker.engine.generation import Generated, Output
from worker.engine.wire.anthropic import (
    MessagesBody,
    anthropic_message,
    anthropic_stop,
    message_reply,
    parse_messages_body,
)
from worker.engine.wire.base import BodyError


def params(**extra: Any) -> dict[str, Any]:
    return {"model": "m", "max_tokens": 16, "messages": [{"role": "user", "content": "Hello"}], **extra}


def parse(**extra: Any) -> MessagesBody:
    body = parse_messages_body(params(**extra))
    assert isinstance(body, MessagesBody)
    return body


def refused(**extra: Any) -> BodyError:
    with pytest.raises(BodyError) as caught:
        parse_messages_body(params(**extra))
    return caught.value


def test_system_and_text_blocks_become_one_chat_conversation_with_consecutive_turns_combined() -> None:
    body = parse(
        system=[
            {"type": "text", "text": "Be brief."},
            {"type": "text", "text": "Use English.", "cache_control": {"type": "ephemeral"}},
        ],
        messages=[
            {"role": "user", "content": "One"},
            {"role": "user", "content": [{"type": "text", "text": "Two"}]},
            {"role": "assistant", "content": "Sure"},
            {"role": "user", "content": "Three"},
        ],
    )
    assert body.conversation() == [
        {"role": "system", "content": "Be brief.\nUse English."},
        {"role": "user", "content": "One\nTwo"},
        {"role": "assistant", "content": "Sure"},
        {"role": "user", "content": "Three"},
    ]
    assert not body.prefill


def test_the_generation_carries_the_sampling_parameters_and_any_number_of_stop_sequences() -> None:
    stops = [f"END{i}" for i in range(8)]  # more than OpenAI's four
    body = parse(temperature=0.2, top_p=0.9, top_k=40, stop_sequences=stops, metadata={"user_id": "u-1"})
    generation = body.generation()
    sampling = generation.sampling
    assert (generation.limit.requested, generation.limit.clamp) == (16, True)  # stops at the context's end
    assert (sampling.temperature, sampling.top_p, sampling.top_k, list(sampling.stop)) == (0.2, 0.9, 40, stops)
    assert list(generation.messages) == [{"role": "user", "content": "Hello"}] and not generation.continue_final


def test_a_final_assistant_turn_is_continued_not_answered() -> None:
    body = parse(
        messages=[{"role": "user", "content": "Name a colour"}, {"role": "assistant", "content": "The colour is"}]
    )
    assert body.prefill and body.generation().continue_final


@pytest.mark.parametrize(
    ("extra", "code", "says"),
    [
        ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "unsupported_tool", "web_search_20250305"),
        ({"tools": [{"name": "get_weather", "input_schema": {"type": "string"}}]}, "invalid_value", "type 'object'"),
        ({"thinking": {"type": "enabled", "budget_tokens": 512}}, "invalid_value", "greater than or equal to 1024"),
        ({"thinking": {"type": "enabled", "budget_tokens": 10**9}}, "invalid_value", "max_tokens must be greater"),
        ({"tool_choice": {"type": "tool"}}, "invalid_value", "'name' is required"),
        ({"stream": True}, "unsupported_parameter", "stream"),
        ({"temperature": 1.5}, "invalid_value", "temperature"),
        ({"top_k": -1}, "invalid_value", "top_k"),
        ({"stop_sequences": ["  "]}, "invalid_value", "non-whitespace"),
        ({"max_tokens": 0}, "invalid_value", "max_tokens"),
        ({"frequency_penalty": 0.5}, "unsupported_parameter", "frequency_penalty"),
        ({"messages": [{"role": "system", "content": "x"}]}, "invalid_value", "messages.0.role"),
        ({"messages": []}, "invalid_value", "messages"),
    ],
)
def test_what_the_engine_cannot_do_is_refused_with_a_message_naming_it(
    extra: dict[str, Any], code: str, says: str
) -> None:
    error = refused(**extra)
    assert error.code == code and says in error.message and error.status_code == 400


def test_a_block_of_an_unknown_type_is_named_as_such() -> None:
    video = {"type": "video", "source": {"type": "url", "url": "https://example.com/a.mp4"}}
    error = refused(messages=[{"role": "user", "content": [{"type": "text", "text": "What is this?"}, video]}])
    assert "content blocks are supported here" in error.message and "'video'" in error.message
    assert "messages.0" in error.message


def test_missing_max_tokens_reads_as_anthropic_says_it() -> None:
    body = params()
    del body["max_tokens"]
    with pytest.raises(BodyError, match="max_tokens: Field required"):
        parse_messages_body(body)


def test_parameters_at_their_off_value_run() -> None:
    body = parse(
        stream=False, thinking={"type": "disabled"}, tools=[], service_tier="auto", cache_control={"type": "ephemeral"}
    )
    assert body.max_tokens == 16


@pytest.mark.parametrize(
    ("finish", "matched", "tokens", "expected"),
    [
        ("length", None, 16, ("max_tokens", None)),
        ("length", None, 9, ("model_context_window_exceeded", None)),  # clamped to the room the context left
        ("stop", "END", 3, ("stop_sequence", "END")),
        ("stop", None, 3, ("end_turn", None)),  # end of sequence
        ("stop", 2, 3, ("end_turn", None)),  # a stop token id (the EOS of the generation config)
    ],
)
def test_stop_reasons_follow_what_the_engine_reports(
    finish: str, matched: Any, tokens: int, expected: tuple[str, str | None]
) -> None:
    assert anthropic_stop(finish_reason=finish, matched=matched, output_tokens=tokens, max_tokens=16) == expected


def test_the_message_parses_as_the_sdk_types_it_and_splits_cached_input() -> None:
    body = anthropic_message(
        message_id="abc",
        model="m",
        text="Hi",
        stop=("stop_sequence", "END"),
        prompt_tokens=100,
        output_tokens=3,
        cached_tokens=64,
    )
    message = Message.model_validate(body)
    assert message.id == "msg_abc" and message.type == "message" and message.role == "assistant"
    assert message.content[0].type == "text" and message.content[0].text == "Hi"
    assert (message.stop_reason, message.stop_sequence) == ("stop_sequence", "END")
    assert (message.usage.input_tokens, message.usage.cache_read_input_tokens, message.usage.output_tokens) == (
        36,
        64,
        3,
    )


def test_an_empty_answer_has_no_content_blocks_as_anthropic_sends_it() -> None:
    body = anthropic_message(
        message_id="x", model="m", text="", stop=("end_turn", None), prompt_tokens=5, output_tokens=1
    )
    assert Message.model_validate(body).content == []


def test_an_output_that_a_stop_string_ended_becomes_a_message_naming_it() -> None:
    output = Output(
        "r1",
        response_id="42",
        sequences=[Generated("abc", token_count=2, finish_reason="stop", matched="END")],
        prompt_tokens=20,
        cached_tokens=16,
    )
    result = message_reply(parse(stop_sequences=["END"]))(output, "mine")
    message = Message.model_validate(result.body)
    assert message.model == "mine" and message.id == "msg_42"
    assert (message.stop_reason, message.stop_sequence) == ("stop_sequence", "END")
    assert (message.usage.input_tokens, message.usage.cache_read_input_tokens) == (4, 16)
    assert (result.prompt_tokens, result.completion_tokens, result.cached_tokens) == (20, 2, 16)


def test_the_fake_engine_answers_a_messages_request_with_a_message() -> None:
    engine = FakeEngine(max_model_len=40)
    assert engine.add(EngineRequest("r1", MESSAGES_URL, params(max_tokens=5, system="Be brief."))) is None
    assert engine.add(EngineRequest("r2", MESSAGES_URL, params(max_tokens=500))) is None  # past the context
    results = {}
    while engine.has_unfinished():
        results.update((r.request_id, r) for r in engine.step())
    first, second = Message.model_validate(results["r1"].body), Message.model_validate(results["r2"].body)
    assert first.stop_reason == "max_tokens" and first.usage.output_tokens == 5 == results["r1"].completion_tokens
    assert second.stop_reason == "model_context_window_exceeded" and second.usage.output_tokens < 500
    refused_result = engine.add(EngineRequest("r3", MESSAGES_URL, params(tools=[{"name": "x"}])))
    assert refused_result is not None and refused_result.status_code == 400  # no input_schema
