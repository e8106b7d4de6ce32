"""Tools and reasoning end to end (issue 37, sections 1 and 3): the official `openai` and `anthropic` SDKs, the real
API, the in-process worker and the real vLLM engine on the demo model, whose chat template renders tools and
thinking and whose registry entry (the embedded default's) names vLLM's "hermes" tool parser and "deepseek_r1"
reasoning parser; one server per backend (SQLite + a local folder, Postgres + S3), every case in a few batches.

The demo model's weights are random, so what is checked is what does not depend on them: forced and strict calls
whose arguments validate against the tool's schema, the finish and stop reasons, the thinking budget as a hard
limit, reasoning tokens in each line's usage and the batch's, and the per-line errors of what cannot run.
"""

from __future__ import annotations

import base64
import hashlib
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import jsonschema
import openai
import pytest
from anthropic.types import Message
from openai.types import Batch
from openai.types.chat import ChatCompletion
from openai.types.responses import Response

from tests.conftest import LiveServer, _truncate_all, configure, make_key, start_server
from tests.integration.api.helpers import read_lines, to_jsonl, upload, wait_for

pytestmark = pytest.mark.vllm

MODEL = "backfill-demo"
CHAT, RESPONSES = "/v1/chat/completions", "/v1/responses"
WEATHER = {  # bounded strings and integers: a random model fills an unbounded string until max_tokens
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 12},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
    },
    "required": ["city", "unit", "days"],
    "additionalProperties": False,
}
LOOKUP = {
    "type": "object",
    "properties": {"q": {"type": "string", "maxLength": 10}},
    "required": ["q"],
    "additionalProperties": False,
}
WEATHER_TOOL = {
    "type": "function",
    "function": {"name": "get_weather", "description": "Weather", "parameters": WEATHER},
}
LOOKUP_TOOL = {"type": "function", "function": {"name": "lookup", "parameters": LOOKUP, "strict": True}}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module", params=["embedded", "postgres"])
def live(
    request: pytest.FixtureRequest, demo_model_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LiveServer]:
    """One server per backend, serving the demo model as the embedded default's registry entry has it."""
    from storage.settings import Settings
    from worker.cli.migrate import migrate_database
    from worker.process import service

    data = tmp_path_factory.mktemp(f"tools-{request.param}")
    spec = Settings(data_dir=data).served_models()[MODEL]  # the embedded default's entry: its parsers
    assert (spec.tool_parser, spec.reasoning_parser) == ("hermes", "deepseek_r1")
    entry = spec.model_dump(mode="json", exclude_defaults=True) | {
        "path": str(demo_model_path),
        "max_num_seqs": 16,
        "max_model_len": 2048,  # 64 MiB of KV cache holds 16k tokens, not the demo model's whole 32k context
        "kv_cache_memory_bytes": 64 << 20,
    }
    env = {"BACKFILL_DATA_DIR": str(data), "BACKFILL_MODELS": json.dumps({MODEL: entry})}
    if request.param == "postgres":
        env["BACKFILL_DATABASE_URL"] = request.getfixturevalue("pg_url")
        env["BACKFILL_S3_ENDPOINT_URL"] = request.getfixturevalue("moto_endpoint")
        env["BACKFILL_S3_BUCKET"] = "backfill-test"
    service.close_engines()
    with pytest.MonkeyPatch.context() as patch:
        configure(patch, env)
        migrate_database()
        _truncate_all()
        if request.param == "postgres":
            from storage.files.blobs import get_blob_store

            get_blob_store().ensure_bucket()  # type: ignore[attr-defined]
        server, stop = start_server(with_worker=True)
        try:
            yield server
        finally:
            stop()
            service.close_engines()


@pytest.fixture(scope="module")
def tool_call_token(demo_model_path: Path) -> int:
    """The demo tokenizer's `<tool_call>` token: a logit bias on it makes the random model call a tool."""
    from transformers import AutoTokenizer

    (token,) = AutoTokenizer.from_pretrained(demo_model_path).encode("<tool_call>", add_special_tokens=False)
    return int(token)


def line(custom_id: str, url: str = CHAT, **body: Any) -> dict[str, Any]:
    return {"custom_id": custom_id, "method": "POST", "url": url, "body": {"model": MODEL, **body}}


def submit(client: openai.OpenAI, lines: list[dict[str, Any]], endpoint: str) -> str:
    source = upload(client, to_jsonl(lines))
    return client.batches.create(input_file_id=source.id, endpoint=endpoint, completion_window="24h").id  # type: ignore[arg-type]


def outcomes(client: openai.OpenAI, batch: Batch) -> tuple[dict[str, Any], dict[str, Any]]:
    """(custom_id -> response body) of the output file, (custom_id -> error object) of the error file."""
    done = {o["custom_id"]: o["response"]["body"] for o in read_lines(client, batch.output_file_id)}
    failed = {e["custom_id"]: e["response"]["body"]["error"] for e in read_lines(client, batch.error_file_id)}
    return done, failed


def tool_lines(bias_token: int) -> list[dict[str, Any]]:
    tools = [WEATHER_TOOL, LOOKUP_TOOL]
    many = [
        {"type": "function", "function": {"name": f"f{i}", "parameters": {"type": "object"}}} for i in range(10_000)
    ]
    history = [
        *ASK,
        {"role": "assistant", "content": None, "tool_calls": [call("call_1", "get_weather", {"city": "Paris"})]},
        {"role": "tool", "tool_call_id": "call_1", "content": "18 degrees, sunny"},
    ]
    return [
        line("required", messages=ASK, tools=tools, tool_choice="required", parallel_tool_calls=False, max_tokens=80),
        line("named", messages=ASK, tools=tools, tool_choice=function("get_weather"), max_tokens=80),
        # tool_choice auto: the bias makes the model open a call; the strict tool's arguments follow its schema
        line(
            "strict_auto",
            messages=ASK,
            tools=[LOOKUP_TOOL],
            parallel_tool_calls=False,
            logit_bias={str(bias_token): 100},
            max_tokens=60,
        ),
        line("auto_text", messages=ASK, tools=tools, max_tokens=6),
        line("none", messages=ASK, tools=tools, tool_choice="none", max_tokens=6),
        line("history", messages=history, tools=tools, max_tokens=6),
        line("think", messages=ASK, reasoning_effort="low", thinking_token_budget=8, max_completion_tokens=20),
        line(
            "think_named",
            messages=ASK,
            tools=tools,
            tool_choice=function("lookup"),
            reasoning_effort="high",
            thinking_token_budget=6,
            max_tokens=60,
        ),
        line("no_think", messages=ASK, reasoning_effort="none", max_tokens=6),
        line("hosted", messages=ASK, tools=[{"type": "web_search_preview"}], max_tokens=6),
        line("ten_thousand_tools", messages=ASK, tools=many, max_tokens=6),
        line("huge_budget", messages=ASK, reasoning_effort="low", thinking_token_budget=10**9, max_tokens=6),
    ]


def call(call_id: str, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}


def function(name: str) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name}}


def responses_lines() -> list[dict[str, Any]]:
    tool = {"type": "function", "name": "get_weather", "parameters": WEATHER}
    history = [
        {"role": "user", "content": "Weather in Paris?"},
        {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city": "Paris"}'},
        {"type": "function_call_output", "call_id": "call_1", "output": "18 degrees"},
    ]
    return [
        line(
            "r_required",
            RESPONSES,
            input="Weather?",
            tools=[tool],
            tool_choice="required",
            parallel_tool_calls=False,
            max_output_tokens=80,
        ),
        line(
            "r_reasoning",
            RESPONSES,
            input="Think first.",
            reasoning={"effort": "low", "summary": "auto"},
            max_output_tokens=12,
        ),
        line("r_history", RESPONSES, input=history, tools=[tool], max_output_tokens=6),
        line("r_hosted", RESPONSES, input="x", tools=[{"type": "file_search", "vector_store_ids": ["vs_1"]}]),
    ]


def anthropic_requests() -> list[dict[str, Any]]:
    tool = {"name": "get_weather", "description": "Weather", "input_schema": WEATHER, "strict": True}
    history = [
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}],
        },
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "18 degrees"}]},
    ]

    def params(**extra: Any) -> dict[str, Any]:
        return {"model": MODEL, "max_tokens": 80, "messages": [{"role": "user", "content": "Weather?"}], **extra}

    return [
        {"custom_id": "a_tool", "params": params(tools=[tool], tool_choice={"type": "tool", "name": "get_weather"})},
        {
            "custom_id": "a_any",
            "params": params(tools=[tool], tool_choice={"type": "any", "disable_parallel_tool_use": True}),
        },
        {
            "custom_id": "a_think",
            "params": params(max_tokens=1030, thinking={"type": "enabled", "budget_tokens": 1024}),
        },
        {"custom_id": "a_history", "params": params(messages=history, tools=[tool], max_tokens=6)},
        {"custom_id": "a_server_tool", "params": params(tools=[{"type": "web_search_20250305", "name": "web_search"}])},
        {"custom_id": "a_no_think", "params": params(max_tokens=6, thinking={"type": "disabled"})},
    ]


@pytest.fixture(scope="module")
def batches(live: LiveServer, tool_call_token: int) -> dict[str, Any]:
    """The three batches, submitted together so that they run side by side on the one engine."""
    client = live.client(make_key("acme"))
    claude = anthropic.Anthropic(api_key=make_key("acme"), base_url=live.base_url, max_retries=0, timeout=120)
    return {
        "client": client,
        "claude": claude,
        "chat": submit(client, tool_lines(tool_call_token), CHAT),
        "responses": submit(client, responses_lines(), RESPONSES),
        "messages": claude.messages.batches.create(requests=anthropic_requests()).id,  # type: ignore[arg-type]
    }


def test_chat_calls_tools_and_thinks_within_its_budget(batches: dict[str, Any]) -> None:
    check_chat(batches["client"], wait_for(batches["client"], batches["chat"], timeout=300))


def test_responses_answer_with_function_call_and_reasoning_items(batches: dict[str, Any]) -> None:
    check_responses(batches["client"], wait_for(batches["client"], batches["responses"], timeout=300))


def test_message_batches_answer_with_tool_use_and_thinking_blocks(batches: dict[str, Any]) -> None:
    check_messages(batches["claude"], batches["messages"])


def check_chat(client: openai.OpenAI, batch: Batch) -> None:
    done, failed = outcomes(client, batch)
    answers = {key: ChatCompletion.model_validate(body) for key, body in done.items()}
    for key, name, finish, schema in (
        ("required", "get_weather", "tool_calls", WEATHER),
        ("named", "get_weather", "stop", WEATHER),  # OpenAI answers a named tool's call with "stop"
        ("strict_auto", "lookup", "tool_calls", LOOKUP),
    ):
        choice = answers[key].choices[0]
        (tool_call,) = choice.message.tool_calls or []
        assert choice.finish_reason == finish and choice.message.content is None, key
        assert tool_call.function.name == name and tool_call.id.startswith("call_")  # type: ignore[union-attr]
        jsonschema.validate(json.loads(tool_call.function.arguments), schema)  # type: ignore[union-attr]
    for key in ("auto_text", "none", "history", "no_think"):
        message = answers[key].choices[0].message
        assert not message.tool_calls and isinstance(message.content, str), key
        assert "reasoning_content" not in (message.model_extra or {})
    think = answers["think"]
    reasoning = (think.choices[0].message.model_extra or {}).get("reasoning_content")
    assert isinstance(reasoning, str) and think.usage and think.usage.completion_tokens_details
    spent = think.usage.completion_tokens_details.reasoning_tokens or 0
    assert 0 < spent <= 8 < think.usage.completion_tokens  # the budget is a hard limit, and the answer follows
    thought_call = answers["think_named"].choices[0].message
    assert (thought_call.model_extra or {}).get("reasoning_content") is not None and thought_call.tool_calls
    jsonschema.validate(json.loads(thought_call.tool_calls[0].function.arguments), LOOKUP)  # type: ignore[union-attr]
    assert failed["hosted"]["code"] == "unsupported_tool" and "web_search_preview" in failed["hosted"]["message"]
    assert failed["ten_thousand_tools"]["code"] == "array_above_max_length"
    assert failed["huge_budget"]["param"] == "thinking_token_budget"
    assert set(failed) == {"hosted", "ten_thousand_tools", "huge_budget"}
    reasoning_total = sum(
        (a.usage.completion_tokens_details.reasoning_tokens or 0)
        if a.usage and a.usage.completion_tokens_details
        else 0
        for a in answers.values()
    )
    assert batch.usage and batch.usage.output_tokens_details.reasoning_tokens == reasoning_total > spent


def check_responses(client: openai.OpenAI, batch: Batch) -> None:
    done, failed = outcomes(client, batch)
    answers = {key: Response.model_validate(body) for key, body in done.items()}
    (called,) = [item for item in answers["r_required"].output if item.type == "function_call"]
    assert called.name == "get_weather" and called.call_id.startswith("call_")
    jsonschema.validate(json.loads(called.arguments), WEATHER)
    thinking = answers["r_reasoning"]
    (item,) = [item for item in thinking.output if item.type == "reasoning"]
    assert item.content and item.summary and item.summary[0].text == item.content[0].text
    assert thinking.usage and thinking.usage.output_tokens_details.reasoning_tokens > 0
    assert thinking.reasoning and thinking.reasoning.effort == "low"
    assert answers["r_history"].status in ("completed", "incomplete")
    assert failed["r_hosted"]["code"] == "unsupported_tool" and "file_search" in failed["r_hosted"]["message"]
    assert batch.usage and batch.usage.output_tokens_details.reasoning_tokens >= (
        thinking.usage.output_tokens_details.reasoning_tokens
    )


def check_messages(claude: anthropic.Anthropic, batch_id: str) -> None:
    deadline = time.time() + 300
    while claude.messages.batches.retrieve(batch_id).processing_status != "ended":
        assert time.time() < deadline, "the message batch did not end"
        time.sleep(0.3)
    results = {entry.custom_id: entry.result for entry in claude.messages.batches.results(batch_id)}
    for key in ("a_tool", "a_any"):
        result = results[key]
        assert result.type == "succeeded", key
        message = Message.model_validate(result.message.model_dump())
        (use,) = [block for block in message.content if block.type == "tool_use"]
        assert message.stop_reason == "tool_use" and use.name == "get_weather" and use.id.startswith("toolu_")
        jsonschema.validate(use.input, WEATHER)
    think = results["a_think"]
    assert think.type == "succeeded"
    thinking = [block for block in think.message.content if block.type == "thinking"]
    assert (
        thinking
        and thinking[0].signature == base64.b64encode(hashlib.sha256(thinking[0].thinking.encode()).digest()).decode()
    )
    assert think.message.usage.output_tokens > 1024  # the thinking stopped at its budget and the answer followed
    assert results["a_history"].type == results["a_no_think"].type == "succeeded"
    assert not [b for b in results["a_no_think"].message.content if b.type == "thinking"]
    server_tool = results["a_server_tool"]
    assert server_tool.type == "errored" and "web_search_20250305" in server_tool.error.error.message
