"""Tools and reasoning in each protocol's bodies and answers, on the fake engine (the same wire code the vLLM adapter
answers with), every answer re-parsed with the official SDK's types: chat `tool_calls` and `reasoning_content`,
Responses `function_call` and `reasoning` items, Anthropic `tool_use` and `thinking` blocks; the conversations
they pass back; what each refuses."""

from __future__ import annotations

import json
from typing import Any

import pytest
from anthropic.types import Message
from openai.types.chat import ChatCompletion
from openai.types.responses import Response

from worker.engine import EngineRequest, EngineResult
from worker.engine.fake import FakeEngine
from worker.engine.wire import parse
from worker.engine.wire.anthropic.tools import signature
from worker.engine.wire.base import BodyError

CHAT, RESPONSES, MESSAGES = "/v1/chat/completions", "/v1/responses", "/v1/messages"
WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
CHAT_TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}}
ASK = [{"role": "user", "content": "Weather in Paris?"}]


def run(*requests: EngineRequest, parsers: bool = True) -> dict[str, EngineResult]:
    engine = FakeEngine("demo", tool_parser="hermes" if parsers else None, reasoning_parser="r1" if parsers else None)
    results: dict[str, EngineResult] = {}
    for request in requests:
        if (refused := engine.add(request)) is not None:
            results[request.request_id] = refused
    while engine.has_unfinished():
        results.update((result.request_id, result) for result in engine.step())
    return results


def chat(rid: str, **body: Any) -> EngineRequest:
    return EngineRequest(rid, CHAT, {"model": "m", "messages": ASK, "max_tokens": 8, **body})


def test_chat_forced_calls_come_back_as_tool_calls_with_openais_finish_reasons() -> None:
    named = {"type": "function", "function": {"name": "get_weather"}}
    results = run(
        chat("required", tools=[CHAT_TOOL], tool_choice="required"),
        chat("named", tools=[CHAT_TOOL], tool_choice=named),
        chat("auto", tools=[CHAT_TOOL]),
    )
    required, named_answer = (ChatCompletion.model_validate(results[k].body).choices[0] for k in ("required", "named"))
    assert required.finish_reason == "tool_calls" and named_answer.finish_reason == "stop"  # as OpenAI answers
    for choice in (required, named_answer):
        (call,) = choice.message.tool_calls or []
        assert choice.message.content is None and call.id.startswith("call_") and call.type == "function"
        assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": ""}  # type: ignore[union-attr]
    auto = ChatCompletion.model_validate(results["auto"].body).choices[0]
    assert auto.message.tool_calls is None and auto.message.content and auto.finish_reason == "length"


def test_chat_reasoning_is_reasoning_content_and_counts_as_reasoning_tokens_of_the_output() -> None:
    results = run(chat("think", reasoning_effort="high", thinking_token_budget=3), chat("off", reasoning_effort="none"))
    think = ChatCompletion.model_validate(results["think"].body)
    extra = think.choices[0].message.model_extra or {}
    assert len(extra["reasoning_content"].split()) == 3 and len((think.choices[0].message.content or "").split()) == 5
    assert think.usage and think.usage.completion_tokens == 8
    assert think.usage.completion_tokens_details and think.usage.completion_tokens_details.reasoning_tokens == 3
    assert results["think"].reasoning_tokens == 3 and results["think"].completion_tokens == 8
    off = ChatCompletion.model_validate(results["off"].body)
    assert (
        "reasoning_content" not in (off.choices[0].message.model_extra or {}) and results["off"].reasoning_tokens == 0
    )


def test_a_conversation_with_calls_and_results_becomes_the_messages_the_template_renders() -> None:
    history = [
        *ASK,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": [{"type": "text", "text": "18 degrees"}]},
    ]
    messages = parse(CHAT, {"model": "m", "messages": history, "tools": [CHAT_TOOL]}).generation.messages
    assert messages[1] == {"role": "assistant", "content": "", "tool_calls": history[1]["tool_calls"]}
    assert messages[2] == {"role": "tool", "content": "18 degrees", "tool_call_id": "call_1"}
    generation = parse(CHAT, {"model": "m", "messages": ASK}).generation
    assert generation.plain_turns() == ASK  # no tools, no thinking: the direct render path
    assert parse(CHAT, {"model": "m", "messages": ASK, "tools": [CHAT_TOOL]}).generation.plain_turns() is None


@pytest.mark.parametrize(
    ("body", "code", "param"),
    [
        ({"tools": [{"type": "web_search_preview"}]}, "unsupported_tool", "tools[0]"),
        ({"tools": [{"type": "custom", "custom": {"name": "x"}}]}, "unsupported_tool", "tools[0]"),
        ({"tools": [CHAT_TOOL] * 129}, "array_above_max_length", "tools"),
        ({"tools": [{"type": "function", "function": {"name": "bad name"}}]}, "invalid_value", "tools"),
        ({"tool_choice": "required"}, "invalid_value", "tool_choice"),
        (
            {"tools": [CHAT_TOOL], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
            "invalid_value",
            "tool_choice",
        ),
        ({"messages": [{"role": "tool", "content": "x"}]}, "invalid_value", "messages"),
        ({"messages": [{"role": "user", "content": None}]}, "invalid_value", "messages"),
        ({"reasoning_effort": "extreme"}, "invalid_value", "reasoning_effort"),
        ({"functions": [{"name": "f"}]}, "unsupported_parameter", "functions"),
    ],
)
def test_what_chat_cannot_run_is_a_400_naming_the_field(body: dict[str, Any], code: str, param: str) -> None:
    with pytest.raises(BodyError) as refused:
        parse(CHAT, {"model": "m", "messages": ASK, **body})
    assert (refused.value.code, refused.value.param) == (code, param), refused.value.message


def test_an_allowed_tools_choice_keeps_only_those_tools() -> None:
    other = {"type": "function", "function": {"name": "other", "parameters": WEATHER}}
    choice = {
        "type": "allowed_tools",
        "allowed_tools": {"mode": "required", "tools": [{"type": "function", "function": {"name": "other"}}]},
    }
    generation = parse(
        CHAT, {"model": "m", "messages": ASK, "tools": [CHAT_TOOL, other], "tool_choice": choice}
    ).generation
    assert [tool.name for tool in generation.tools] == ["other"] and generation.tool_choice.mode == "required"


def test_responses_calls_and_reasoning_are_output_items_and_usage_counts_the_thinking() -> None:
    tool = {"type": "function", "name": "get_weather", "parameters": WEATHER, "strict": True}
    history = [
        *ASK,
        {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{}", "id": "fc_1"},
        {"type": "function_call_output", "call_id": "call_1", "output": "18 degrees"},
        {"type": "reasoning", "id": "rs_1", "summary": []},
    ]
    body = {
        "model": "m",
        "input": history,
        "tools": [tool],
        "tool_choice": "required",
        "reasoning": {"effort": "low", "summary": "auto"},
        "max_output_tokens": 8,
    }
    messages = parse(RESPONSES, body).generation.messages
    assert messages[1]["tool_calls"][0]["id"] == "call_1" and messages[2]["role"] == "tool" and len(messages) == 3
    result = run(EngineRequest("r", RESPONSES, body))["r"]
    response = Response.model_validate(result.body)
    kinds = [item.type for item in response.output]
    assert kinds == ["reasoning", "function_call"] and response.tool_choice == "required"
    reasoning, called = response.output
    assert reasoning.type == "reasoning" and reasoning.summary[0].text == reasoning.content[0].text  # type: ignore[index]
    assert called.type == "function_call" and called.call_id.startswith("call_") and called.name == "get_weather"
    assert response.usage and response.usage.output_tokens_details.reasoning_tokens == 4 == result.reasoning_tokens
    assert response.tools[0].type == "function" and response.reasoning and response.reasoning.summary == "auto"


def test_responses_refuse_hosted_tools_by_name() -> None:
    for tools, choice in (
        ([{"type": "code_interpreter", "container": {"type": "auto"}}], None),
        ([], {"type": "web_search_preview"}),
        ([{"type": "mcp", "server_label": "x"}], None),
    ):
        body: dict[str, Any] = {"model": "m", "input": "x", "tools": tools}
        if choice:
            body["tool_choice"] = choice
        with pytest.raises(BodyError) as refused:
            parse(RESPONSES, body)
        assert refused.value.code == "unsupported_tool"
        assert (choice or tools[0])["type"] in refused.value.message


def messages(rid: str, **params: Any) -> EngineRequest:
    return EngineRequest(rid, MESSAGES, {"model": "m", "max_tokens": 1200, "messages": ASK, **params})


def test_anthropic_calls_are_tool_use_blocks_and_thinking_a_signed_thinking_block() -> None:
    tool = {"name": "get_weather", "input_schema": WEATHER, "strict": True}
    results = run(
        messages("tool", tools=[tool], tool_choice={"type": "tool", "name": "get_weather"}, max_tokens=8),
        messages("think", thinking={"type": "enabled", "budget_tokens": 1024}),
        messages("hidden", thinking={"type": "adaptive", "display": "omitted"}, max_tokens=8),
    )
    called = Message.model_validate(results["tool"].body)
    (use,) = called.content
    assert called.stop_reason == "tool_use" and use.type == "tool_use" and use.input == {"city": ""}
    assert use.id.startswith("toolu_")
    think = Message.model_validate(results["think"].body)
    block, text = think.content
    assert block.type == "thinking" and block.signature == signature(block.thinking) and text.type == "text"
    assert len(block.thinking.split()) == 1024 == results["think"].reasoning_tokens
    assert think.usage.output_tokens == 1200  # thinking is output, as Anthropic bills it
    hidden = Message.model_validate(results["hidden"].body).content[0]
    assert hidden.type == "thinking" and hidden.thinking == "" and hidden.signature


def test_anthropic_tool_results_become_tool_messages_before_the_turns_text() -> None:
    turns = [
        *ASK,
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "Paris.", "signature": "c2ln"},
                {"type": "text", "text": "Checking."},
                {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}},
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "18"}]},
                {"type": "tool_result", "tool_use_id": "toolu_2", "content": "timeout", "is_error": True},
                {"type": "text", "text": "And tomorrow?"},
            ],
        },
    ]
    generation = parse(MESSAGES, {"model": "m", "max_tokens": 8, "messages": turns}).generation
    assert generation.messages[1]["tool_calls"][0]["function"] == {
        "name": "get_weather",
        "arguments": '{"city": "Paris"}',
    }
    assert generation.messages[1]["content"] == "Checking."
    assert [m["role"] for m in generation.messages] == ["user", "assistant", "tool", "tool", "user"]
    assert generation.messages[3]["content"] == "Error: timeout"


def test_a_model_that_cannot_think_answers_as_each_vendor_does_for_its_own() -> None:
    results = run(
        chat("effort", reasoning_effort="low"),
        chat("none", reasoning_effort="none"),
        EngineRequest("responses", RESPONSES, {"model": "m", "input": "x", "reasoning": {"effort": "high"}}),
        messages("thinking", thinking={"type": "enabled", "budget_tokens": 1024}),
        messages("disabled", thinking={"type": "disabled"}, max_tokens=4),
        chat("auto_tools", tools=[CHAT_TOOL]),
        chat("forced", tools=[CHAT_TOOL], tool_choice="required"),
        parsers=False,
    )
    assert (
        results["effort"].error_message == "Unsupported parameter: 'reasoning_effort' is not supported with this model."
    )
    assert results["responses"].error_message == (
        "Unsupported parameter: 'reasoning.effort' is not supported with this model."
    )
    assert results["thinking"].error_message == "'demo' does not support thinking."
    assert results["auto_tools"].body["error"]["param"] == "tool_choice"
    assert results["none"].ok and results["disabled"].ok and results["forced"].ok
