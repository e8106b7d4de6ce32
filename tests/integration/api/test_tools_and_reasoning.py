"""Tools and reasoning through the real API and worker on the fake engine, on both backends: reasoning tokens land
in each line's usage and in the batch's `usage.output_tokens_details.reasoning_tokens`, and are billed as output;
a model whose registry entry names no parsers refuses thinking line by line, as the vendors do for theirs.

The real engine runs the same shapes in tests/e2e/api/test_tools_and_reasoning.py.
"""

from __future__ import annotations

import json
import time
from typing import Any

import anthropic
import pytest
from anthropic.types import Message
from openai.types.chat import ChatCompletion

from tests.conftest import LiveServer, make_key
from tests.integration.api.helpers import read_lines, to_jsonl, upload, wait_for

MODELS = json.dumps(
    {
        "thinker": {"path": "fake:", "max_model_len": 4096, "tool_parser": "hermes", "reasoning_parser": "deepseek_r1"},
        "plain": {"path": "fake:", "max_model_len": 4096},
    }
)
pytestmark = pytest.mark.backfill_env({"BACKFILL_MODELS": MODELS})
TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}


def chat(custom_id: str, model: str, **body: Any) -> dict[str, Any]:
    messages = [{"role": "user", "content": "hi"}]
    return {
        "custom_id": custom_id,
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {"model": model, "messages": messages, "max_tokens": 6, **body},
    }


def test_reasoning_tokens_add_up_in_the_batch_usage_and_bill_as_output(api: LiveServer) -> None:
    client = api.client(make_key("acme"))
    lines = [
        chat("think", "thinker", reasoning_effort="low", thinking_token_budget=2),
        chat("think_more", "thinker", reasoning_effort="high"),
        chat("call", "thinker", tools=[TOOL], tool_choice="required"),
        chat("plain", "thinker"),
    ]
    source = upload(client, to_jsonl(lines))
    batch = client.batches.create(input_file_id=source.id, endpoint="/v1/chat/completions", completion_window="24h")
    done = wait_for(client, batch.id)
    answers = {
        o["custom_id"]: ChatCompletion.model_validate(o["response"]["body"])
        for o in read_lines(client, done.output_file_id)
    }
    spent = {
        key: answer.usage.completion_tokens_details.reasoning_tokens  # type: ignore[union-attr]
        for key, answer in answers.items()
    }
    assert spent == {"think": 2, "think_more": 3, "call": 0, "plain": 0}
    assert answers["call"].choices[0].message.tool_calls and answers["call"].choices[0].finish_reason == "tool_calls"
    assert done.usage and done.usage.output_tokens_details.reasoning_tokens == 5 and done.usage.output_tokens == 24
    cost = client.batches.retrieve(done.id).model_extra["cost"]  # type: ignore[index]
    assert cost["output_tokens"] == 24  # thinking is billed as output tokens: it is output


def test_a_model_without_a_reasoning_parser_refuses_thinking_per_line(api: LiveServer) -> None:
    client = api.client(make_key("acme"))
    lines = [chat("effort", "plain", reasoning_effort="medium"), chat("off", "plain", reasoning_effort="none")]
    source = upload(client, to_jsonl(lines))
    batch = client.batches.create(input_file_id=source.id, endpoint="/v1/chat/completions", completion_window="24h")
    done = wait_for(client, batch.id)
    assert done.request_counts and (done.request_counts.completed, done.request_counts.failed) == (1, 1)
    (error,) = read_lines(client, done.error_file_id)
    assert error["response"]["status_code"] == 400 and error["response"]["body"]["error"] == {
        "message": "Unsupported parameter: 'reasoning_effort' is not supported with this model.",
        "type": "invalid_request_error",
        "param": "reasoning_effort",
        "code": "unsupported_parameter",
    }

    claude = anthropic.Anthropic(api_key=make_key("acme"), base_url=api.base_url, max_retries=0)
    params = {"max_tokens": 1100, "messages": [{"role": "user", "content": "hi"}]}
    thinking = {"type": "enabled", "budget_tokens": 1024}
    created = claude.messages.batches.create(
        requests=[  # type: ignore[list-item]
            {"custom_id": "plain", "params": {"model": "plain", "thinking": thinking, **params}},
            {"custom_id": "thinker", "params": {"model": "thinker", "thinking": thinking, **params}},
        ]
    )
    deadline = time.time() + 60
    while claude.messages.batches.retrieve(created.id).processing_status != "ended":
        assert time.time() < deadline
        time.sleep(0.1)
    results = {line.custom_id: line.result for line in claude.messages.batches.results(created.id)}
    refused = results["plain"]
    assert refused.type == "errored" and refused.error.error.message == "'plain' does not support thinking."
    assert refused.error.error.type == "invalid_request_error"
    answered = results["thinker"]
    assert answered.type == "succeeded"
    message = Message.model_validate(answered.message.model_dump())
    assert message.content[0].type == "thinking" and message.usage.output_tokens == 1100
