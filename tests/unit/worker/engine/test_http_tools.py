"""Shared mode: tools and thinking go to the vLLM server as its chat endpoint takes them (it renders, enforces and
parses with its own parsers), and its tool calls and reasoning come back as the line's answer."""

from __future__ import annotations

from openai.types.chat import ChatCompletion

from worker.engine.http_wire import output_of, server_request
from worker.engine.wire import parse

WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}}
TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}}


def test_tools_a_named_choice_and_thinking_go_to_the_server_as_vllm_takes_them() -> None:
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": "hi"}],
        "tools": [TOOL],
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
        "parallel_tool_calls": False,
        "reasoning_effort": "low",
        "thinking_token_budget": 64,
    }
    url, payload = server_request(parse("/v1/chat/completions", body).generation)
    assert url == "/v1/chat/completions" and payload["tools"] == [TOOL]
    assert payload["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}
    assert payload["parallel_tool_calls"] is False and payload["reasoning_effort"] == "low"
    assert payload["chat_template_kwargs"] == {"enable_thinking": True} and payload["thinking_token_budget"] == 64
    _, plain = server_request(parse("/v1/chat/completions", {"model": "m", "messages": body["messages"]}).generation)
    assert not {"tools", "tool_choice", "chat_template_kwargs", "thinking_token_budget"} & set(plain)


def test_the_servers_calls_and_reasoning_come_back_in_the_lines_answer() -> None:
    parsed = parse(
        "/v1/chat/completions", {"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": [TOOL]}
    )
    message = {
        "role": "assistant",
        "content": None,
        "reasoning": "Paris, then.",
        "tool_calls": [
            {
                "id": "chatcmpl-tool-9",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
            }
        ],
    }
    answer = {
        "id": "chatcmpl-1",
        "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls"}],
        "usage": {"prompt_tokens": 9, "completion_tokens": 12, "completion_tokens_details": {"reasoning_tokens": 4}},
    }
    output = output_of("r1", parsed.generation, answer, cached_tokens=0)
    result = parsed.answer(output, "demo")
    choice = ChatCompletion.model_validate(result.body).choices[0]
    (call,) = choice.message.tool_calls or []
    assert choice.finish_reason == "tool_calls" and call.function.name == "get_weather"  # type: ignore[union-attr]
    assert (choice.message.model_extra or {})["reasoning_content"] == "Paris, then." and result.reasoning_tokens == 4
