"""Structured output in every dialect (chat `response_format`, Responses `text.format`, Anthropic
`output_config.format`) and the other fields real batch files carry (issue 37 sections 4 and 6), read off a line's
body; what the vLLM adapter makes of a schema (`grammar_schema`) and of a schema its backend refuses."""

from __future__ import annotations

from typing import Any

import pytest

from worker.engine.generation import Constraint, Generation
from worker.engine.vllm_inputs import grammar_schema
from worker.engine.vllm_outputs import invalid_result
from worker.engine.wire import parse
from worker.engine.wire.base import BodyError

CHAT, RESPONSES, MESSAGES = "/v1/chat/completions", "/v1/responses", "/v1/messages"
# A schema as pydantic writes it for `Optional` fields and nested models, with what JSON Schema documents carry.
SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "$id": "https://example.com/review.schema.json",
    "$defs": {"Tag": {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}},
    "type": "object",
    "properties": {
        "score": {"anyOf": [{"type": "integer"}, {"type": "null"}], "default": None},
        "tags": {"type": "array", "items": {"$ref": "#/$defs/Tag"}},
    },
    "required": ["score", "tags"],
    "additionalProperties": False,
}
CHAT_BODY = {"model": "m", "messages": [{"role": "user", "content": "rate it"}]}
MESSAGES_BODY = {"model": "m", "max_tokens": 64, "messages": [{"role": "user", "content": "rate it"}]}


def constraint(url: str, body: dict[str, Any]) -> Constraint | None:
    return parse(url, body).generation.constraint


def refused(url: str, body: dict[str, Any]) -> BodyError:
    with pytest.raises(BodyError) as caught:
        parse(url, body)
    return caught.value


def test_each_dialect_asks_for_the_same_schema_and_names_its_own_field() -> None:
    chat = {**CHAT_BODY, "response_format": {"type": "json_schema", "json_schema": {"name": "r", "schema": SCHEMA}}}
    responses = {
        "model": "m",
        "input": "rate it",
        "text": {"format": {"type": "json_schema", "name": "r", "schema": SCHEMA}},
    }
    anthropic = {**MESSAGES_BODY, "output_config": {"format": {"type": "json_schema", "schema": SCHEMA}}}
    beta = {**MESSAGES_BODY, "output_format": {"type": "json_schema", "schema": SCHEMA}}
    assert constraint(CHAT, chat) == Constraint(json_schema=SCHEMA, param="response_format")
    assert constraint(RESPONSES, responses) == Constraint(json_schema=SCHEMA, param="text.format")
    assert constraint(MESSAGES, anthropic) == Constraint(json_schema=SCHEMA, param="output_config.format")
    assert constraint(MESSAGES, beta) == Constraint(json_schema=SCHEMA, param="output_format")
    assert constraint(CHAT, {**CHAT_BODY, "response_format": {"type": "json_object"}}) == Constraint(json_object=True)
    assert constraint(MESSAGES, MESSAGES_BODY) is None


def test_output_config_effort_is_the_reasoning_effort_of_a_thinking_answer() -> None:
    """The corpus: pydantic-ai's adaptive thinking sends `output_config.effort` (Anthropic takes it on Opus 4.5 and
    later); it was refused line by line."""
    adaptive = {**MESSAGES_BODY, "thinking": {"type": "adaptive"}, "output_config": {"effort": "high"}}
    reasoning = parse(MESSAGES, adaptive).generation.reasoning
    assert reasoning is not None and reasoning.enabled and reasoning.effort == "high"
    plain = parse(MESSAGES, {**MESSAGES_BODY, "output_config": {"effort": "low"}}).generation
    assert plain.reasoning is None and plain.constraint is None  # accepted: nothing to think, nothing to shape
    off = {**MESSAGES_BODY, "thinking": {"type": "disabled"}, "output_config": {"effort": "max"}}
    assert (
        parse(MESSAGES, off).generation.reasoning == parse(MESSAGES, {**off, "output_config": {}}).generation.reasoning
    )


@pytest.mark.parametrize(
    ("url", "body", "param", "says"),
    [
        (
            MESSAGES,
            {**MESSAGES_BODY, "output_config": {"format": {"type": "json_object"}}},
            "output_config",
            "output_config.format.type",
        ),
        (
            MESSAGES,
            {
                **MESSAGES_BODY,
                "output_config": {"format": {"type": "json_schema", "schema": SCHEMA}},
                "output_format": {"type": "json_schema", "schema": SCHEMA},
            },
            "output_format",
            "not both",
        ),
        (
            MESSAGES,
            {
                **MESSAGES_BODY,
                "messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "{"}],
                "output_config": {"format": {"type": "json_schema", "schema": SCHEMA}},
            },
            "output_config.format",
            "a prefilled answer (a final assistant turn) cannot be held to a JSON schema",
        ),
        (CHAT, {**CHAT_BODY, "response_format": {"type": "json_schema"}}, "response_format", "needs 'json_schema'"),
        (
            RESPONSES,
            {"model": "m", "input": "x", "text": {"verbosity": "low"}},
            "text",
            "supported values are: 'medium'",
        ),
        (
            RESPONSES,
            {"model": "m", "input": "x", "include": ["file_search_call.results"]},
            "include",
            "needs the file_search tool",
        ),
        (RESPONSES, {"model": "m", "input": "x", "include": ["nonsense"]}, "include", "unknown value 'nonsense'"),
        (RESPONSES, {"model": "m", "input": "x", "service_tier": "turbo"}, "service_tier", "service_tier"),
        (CHAT, {**CHAT_BODY, "store": True}, "store", "store=True is not supported"),
    ],
)
def test_a_field_this_server_cannot_honour_fails_the_line_naming_it(
    url: str, body: dict[str, Any], param: str, says: str
) -> None:
    error = refused(url, body)
    assert error.param == param and says in error.message and error.status_code == 400


def test_the_other_fields_real_files_carry_run() -> None:
    chat = parse(
        CHAT,
        {
            **CHAT_BODY,
            "max_completion_tokens": 7,
            "stop": [],
            "store": False,
            "service_tier": "flex",
            "prompt_cache_key": "k",
            "prompt_cache_retention": "24h",
            "safety_identifier": "u-1",
            "metadata": {"run": "7"},
            "modalities": ["text"],
            "verbosity": "medium",
        },
    ).generation
    assert chat.limit.requested == 7 and chat.sampling.stop == ()
    responses = parse(
        RESPONSES,
        {
            "model": "m",
            "input": "x",
            "store": False,
            "service_tier": "priority",
            "include": ["message.output_text.logprobs", "reasoning.encrypted_content"],
            "top_logprobs": 3,
            "text": {"verbosity": "medium"},
        },
    ).generation
    assert responses.sampling.logprobs == 3  # include asks for the output text's logprobs, top_logprobs how many
    cached = {"type": "ephemeral", "ttl": "1h"}
    messages = parse(
        MESSAGES,
        {
            **MESSAGES_BODY,
            "system": [{"type": "text", "text": "You rate things.", "cache_control": cached}],
            "messages": [{"role": "user", "content": [{"type": "text", "text": "rate it", "cache_control": cached}]}],
            "cache_control": {"type": "ephemeral"},
            "stream": False,
            "top_k": 40,
            "service_tier": "standard_only",
            "metadata": {"user_id": "u-1"},
        },
    ).generation
    assert messages.sampling.top_k == 40 and messages.messages[0] == {"role": "system", "content": "You rate things."}


def test_a_tier_asked_for_is_answered_as_the_default_tier_that_ran_it() -> None:
    from worker.engine.generation import Generated, Output

    output = Output("r", prompt_tokens=2, sequences=[Generated(text="{}", token_count=1, finish_reason="stop")])
    chat = parse(CHAT, {**CHAT_BODY, "service_tier": "priority"}).answer(output, "m").body
    plain = parse(CHAT, CHAT_BODY).answer(output, "m").body
    assert chat["service_tier"] == "default" and "service_tier" not in plain


def test_formats_the_grammar_cannot_enforce_are_left_to_annotation_and_the_rest_kept() -> None:
    schema = {
        "type": "object",
        "properties": {
            "phone": {"type": "string", "format": "phone"},
            "when": {"type": "string", "format": "date-time"},
            "format": {"type": "string"},  # a property named "format" is not the keyword
        },
        "$defs": {"Secret": {"type": "string", "format": "password"}},
        "anyOf": [{"format": "binary"}],
    }
    compiled = grammar_schema(schema)
    assert "format" not in compiled["properties"]["phone"] and compiled["properties"]["when"]["format"] == "date-time"
    assert compiled["properties"]["format"] == {"type": "string"}
    assert "format" not in compiled["$defs"]["Secret"] and "format" not in compiled["anyOf"][0]
    assert schema["properties"]["phone"]["format"] == "phone"  # the line's own schema is left alone
    assert grammar_schema(SCHEMA) is SCHEMA  # nothing to drop: no copy


def test_a_schema_the_backend_cannot_compile_fails_its_line_naming_the_field_and_the_reason() -> None:
    generation = Generation(kind="chat", constraint=Constraint(json_schema={"type": "string"}, param="text.format"))
    error = ValueError('Grammar error: Unimplemented keys: ["uniqueItems"]')
    result = invalid_result("r", error, generation)
    assert result.status_code == 400 and result.error_code == "invalid_json_schema"
    body = result.body["error"]
    assert body["param"] == "text.format"
    assert (
        body["message"]
        == 'text.format: the JSON schema cannot be enforced by this server: Unimplemented keys: ["uniqueItems"]'
    )
    other = invalid_result("r", ValueError("something else"), generation)
    assert other.error_code == "invalid_value" and other.body["error"]["message"] == "something else"
