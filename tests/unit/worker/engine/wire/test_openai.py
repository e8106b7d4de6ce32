"""OpenAI bodies in and out, shared by every engine: Responses requests, output caps, cached-token usage.

Engine-neutral rules run through the fake engine (same code path as vLLM's adapter: `worker.engine.wire`);
the real engine runs the same cases in tests/e2e/worker/engine/test_vllm_engine.py.
"""

from __future__ import annotations

from typing import Any

import pytest
from openai.types import Completion
from openai.types.chat import ChatCompletion
from openai.types.responses import Response

from worker.engine import EngineRequest, EngineResult
from worker.engine.fake import FakeEngine
from worker.engine.wire.base import BodyError
from worker.engine.wire.openai import ChatBody, ResponsesBody
from worker.engine.wire.openai import parse_openai_body as parse_body

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
RESPONSES = "/v1/responses"


def drain(engine: FakeEngine, *requests: EngineRequest) -> dict[str, EngineResult]:
    results: dict[str, EngineResult] = {}
    for request in requests:
        if (refused := engine.add(request)) is not None:
            results[request.request_id] = refused
    while engine.has_unfinished():
        results.update((r.request_id, r) for r in engine.step())
    return results


def chat(request_id: str, **body: Any) -> EngineRequest:
    return EngineRequest(request_id, CHAT, {"model": "m", "messages": [{"role": "user", "content": "a b c"}], **body})


def responses(request_id: str, **body: Any) -> EngineRequest:
    return EngineRequest(request_id, RESPONSES, {"model": "m", "input": "tell me a story", **body})


def test_max_tokens_beyond_the_context_is_a_400_with_openais_message_not_a_clamped_answer() -> None:
    engine = FakeEngine(max_model_len=2048)
    results = drain(
        engine,
        chat("chat", max_tokens=10_000_000),
        chat("completion_cap", max_completion_tokens=2047),
        EngineRequest("legacy", COMPLETIONS, {"model": "m", "prompt": "one two", "max_tokens": 2047}),
        responses("responses", max_output_tokens=4096),
    )
    for rid, param in (
        ("chat", "max_tokens"),
        ("completion_cap", "max_completion_tokens"),
        ("legacy", "max_tokens"),
        ("responses", "max_output_tokens"),
    ):
        result = results[rid]
        assert (result.status_code, result.error_code) == (400, "context_length_exceeded"), rid
        assert result.body["error"]["param"] == param and result.body["error"]["type"] == "invalid_request_error"
        assert result.error_message and result.error_message.startswith(
            "This model's maximum context length is 2048 tokens. However, you requested "
        )
        assert (result.prompt_tokens, result.completion_tokens) == (0, 0)  # nothing to bill
    assert "10000005 tokens (5 in the messages, 10000000 in the completion)" in (results["chat"].error_message or "")
    assert "(2 in your prompt, 2047 in the completion)" in (results["legacy"].error_message or "")


def test_a_cap_that_just_fits_runs_and_no_cap_takes_the_default() -> None:
    (probe,) = drain(FakeEngine(), chat("probe", max_tokens=1)).values()
    room = 2048 - probe.prompt_tokens
    results = drain(
        FakeEngine(max_model_len=2048), chat("none"), chat("fits", max_tokens=room), chat("over", max_tokens=room + 1)
    )
    assert results["none"].ok and results["none"].completion_tokens == 16
    assert results["fits"].ok and results["fits"].completion_tokens == room
    assert results["over"].error_code == "context_length_exceeded"


def test_a_responses_request_runs_as_chat_and_comes_back_as_a_response_the_sdk_parses() -> None:
    engine = FakeEngine()
    request = responses(
        "r1",
        instructions="Answer in one word.",
        input=[
            {"role": "user", "content": "hi"},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "hello"}]},
            {"role": "user", "content": [{"type": "input_text", "text": "and now?"}]},
        ],
        max_output_tokens=5,
        temperature=0.2,
        metadata={"job": "nightly"},
    )
    result = drain(engine, request)["r1"]
    assert result.ok, result.body
    response = Response.model_validate(result.body)
    assert response.object == "response" and response.id.startswith("resp_") and response.model == "fake-model"
    assert response.status == "incomplete" and response.incomplete_details
    assert response.incomplete_details.reason == "max_output_tokens"  # it stopped at the cap, as OpenAI says
    (message,) = response.output
    assert message.type == "message" and message.role == "assistant"
    (part,) = message.content
    assert part.type == "output_text" and len(part.text.split()) == 5 and response.output_text == part.text
    assert response.usage and response.usage.output_tokens == 5 == result.completion_tokens
    assert response.usage.input_tokens == result.prompt_tokens
    assert response.usage.total_tokens == result.prompt_tokens + 5
    assert response.instructions == "Answer in one word." and response.temperature == 0.2
    assert response.metadata == {"job": "nightly"} and response.max_output_tokens == 5


def test_instructions_lead_the_conversation_and_text_format_becomes_structured_output() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    body = parse_body(
        RESPONSES,
        {
            "model": "m",
            "instructions": "Be brief.",
            "input": "a number please",
            "max_output_tokens": 20,
            "top_p": 0.9,
            "text": {"format": {"type": "json_schema", "name": "answer", "schema": schema, "strict": True}},
        },
    )
    assert isinstance(body, ResponsesBody)
    chat_body = body.as_chat()
    assert isinstance(chat_body, ChatBody)
    assert chat_body.conversation() == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "a number please"},
    ]
    assert chat_body.max_tokens == 20 and chat_body.top_p == 0.9
    assert chat_body.response_format and chat_body.response_format.type == "json_schema"
    assert chat_body.response_format.json_schema and chat_body.response_format.json_schema.schema_ == schema
    assert chat_body.requested_output() == (20, "max_output_tokens")


@pytest.mark.parametrize(
    ("body", "code", "param"),
    [
        ({"input": "x", "tools": [{"type": "web_search"}]}, "unsupported_tool", "tools[0]"),
        ({"input": "x", "tool_choice": {"type": "file_search"}}, "unsupported_tool", "tool_choice"),
        ({"input": "x", "stream": True}, "unsupported_parameter", "stream"),
        ({"input": "x", "reasoning": {"effort": "extreme"}}, "invalid_value", "reasoning"),
        ({"input": "x", "store": True}, "unsupported_parameter", "store"),
        ({"input": ""}, "invalid_value", "input"),
        ({}, "missing_required_parameter", "input"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": "AA"}}]}]},
            "invalid_value",
            "input",
        ),
        ({"input": "x", "text": {"format": {"type": "json_schema"}}}, "invalid_value", "text"),
        ({"input": "x", "max_output_tokens": 0}, "invalid_value", "max_output_tokens"),
    ],
)
def test_what_the_engine_cannot_do_in_a_responses_body_is_a_400_on_that_line(
    body: dict[str, Any], code: str, param: str
) -> None:
    with pytest.raises(BodyError) as raised:
        parse_body(RESPONSES, {"model": "m", **body})
    assert (raised.value.code, raised.value.param) == (code, param)


def test_usage_carries_cached_prompt_tokens_from_the_prefix_cache() -> None:
    engine = FakeEngine()
    system = {"role": "system", "content": "you are a careful assistant " * 10}
    first = chat("first", messages=[system, {"role": "user", "content": "one"}], max_tokens=2)
    later = chat("later", messages=[system, {"role": "user", "content": "two"}], max_tokens=2)
    alone = EngineRequest("alone", COMPLETIONS, {"model": "m", "prompt": "x y", "max_tokens": 2})
    results = drain(engine, first, later, alone)
    bodies = {rid: ChatCompletion.model_validate(results[rid].body) for rid in ("first", "later")}
    cached = {
        rid: (b.usage.prompt_tokens_details.cached_tokens if b.usage and b.usage.prompt_tokens_details else None)
        for rid, b in bodies.items()
    }
    assert cached == {"first": 0, "later": results["later"].cached_tokens}
    assert 0 < results["later"].cached_tokens < results["later"].prompt_tokens
    completion = Completion.model_validate(results["alone"].body)
    assert completion.usage and completion.usage.prompt_tokens_details
    assert completion.usage.prompt_tokens_details.cached_tokens == 0
