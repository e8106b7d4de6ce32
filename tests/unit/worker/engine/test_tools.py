"""The neutral tool-call rules (worker/engine/tools.py): what a forced tool choice constrains an answer to, the
calls read back from a constrained answer, call ids, and which models are refused tools or thinking."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import pytest

from worker.engine.generation import BodyError, Generation, Reasoning, Tool, ToolChoice
from worker.engine.tools import (
    check_capabilities,
    derived_ids,
    forced_calls,
    forced_schema,
    normalized_arguments,
    random_ids,
    sample_arguments,
)

WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "days": {"type": "integer", "minimum": 1}},
    "required": ["city", "days"],
}
UNIT = {"$defs": {"unit": {"enum": ["c", "f"]}}, "type": "object", "properties": {"u": {"$ref": "#/$defs/unit"}}}


def generation(mode: str = "required", *, name: str | None = None, parallel: bool = True, **extra: Any) -> Generation:
    tools = (Tool("get_weather", parameters=WEATHER), Tool("unit", parameters=UNIT))
    choice = ToolChoice(mode=mode, name=name, parallel=parallel)  # type: ignore[arg-type]
    return Generation(
        kind="chat", messages=({"role": "user", "content": "hi"},), tools=tools, tool_choice=choice, **extra
    )


def test_a_named_tool_forces_its_own_arguments_schema() -> None:
    assert forced_schema(generation("named", name="get_weather")) == WEATHER
    assert forced_schema(generation("auto")) is None and forced_schema(generation("none")) is None


def test_required_forces_a_list_of_calls_with_shared_definitions_moved_to_the_root() -> None:
    schema = forced_schema(generation(parallel=False))
    assert schema is not None and schema["maxItems"] == 1 and schema["$defs"] == UNIT["$defs"]
    answer = [{"name": "unit", "parameters": {"u": "c"}}]
    jsonschema.validate(answer, schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate([{"name": "unit", "parameters": {"u": "kelvin"}}], schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(answer * 2, schema)  # parallel calls off
    assert "maxItems" not in (forced_schema(generation()) or {})


def test_two_tools_defining_one_name_differently_cannot_be_required() -> None:
    other = {"$defs": {"unit": {"enum": ["k"]}}, "type": "object"}
    clash = Generation(
        kind="chat",
        tools=(Tool("a", parameters=UNIT), Tool("b", parameters=other)),
        tool_choice=ToolChoice(mode="required"),
    )
    with pytest.raises(BodyError) as refused:
        forced_schema(clash)
    assert refused.value.param == "tools" and "$defs.unit" in refused.value.message


def test_a_constrained_answer_reads_back_as_calls_with_strict_json_arguments() -> None:
    ids = derived_ids("r1")
    (call,) = forced_calls('{"city": "Pa\x01ris", "days": 2}', generation("named", name="get_weather"), ids) or []
    assert call.name == "get_weather" and json.loads(call.arguments) == {"city": "Pa\x01ris", "days": 2}
    calls = forced_calls(
        '[{"name": "get_weather", "parameters": {"city": "x", "days": 1}}, {"name": "unit", "parameters": {}}]',
        generation(),
        ids,
    )
    assert [c.name for c in calls or []] == ["get_weather", "unit"]
    assert forced_calls('{"city": "Par', generation("named", name="get_weather"), ids) is None  # cut short
    assert forced_calls('{"name": "x"}', generation(), ids) is None  # not a list
    assert normalized_arguments('{"a":\t"\x02"}') == '{"a": "\\u0002"}' and normalized_arguments("{oops") == "{oops"


def test_call_ids_are_24_letters_and_digits_and_a_seed_gives_the_same_ones() -> None:
    first, again, fresh = derived_ids("r1"), derived_ids("r1"), random_ids()
    made = [next(first) for _ in range(3)]
    assert made == [next(again) for _ in range(3)] and len(set(made)) == 3
    assert all(len(i) == 24 and i.isalnum() for i in [*made, next(fresh)])


@pytest.mark.parametrize(
    "schema",
    [
        WEATHER,
        UNIT,
        {
            "type": "object",
            "properties": {"tags": {"type": "array", "items": {"type": "string"}, "minItems": 2}},
            "required": ["tags"],
        },
        {"type": "object", "properties": {"n": {"type": ["null", "number"], "minimum": 3}}, "required": ["n"]},
        {
            "type": "object",
            "properties": {"s": {"type": "string", "minLength": 3}, "b": {"type": "boolean"}, "k": {"const": "fixed"}},
            "required": ["s", "b", "k"],
        },
    ],
)
def test_the_fake_engines_sample_arguments_satisfy_simple_schemas(schema: dict[str, Any]) -> None:
    jsonschema.validate(sample_arguments(schema), schema)


def test_a_model_without_parsers_refuses_thinking_and_auto_calls_as_each_vendor_words_it() -> None:
    openai_effort = Reasoning(effort="low")
    anthropic_thinking = Reasoning(param="thinking", refusal="'{model}' does not support thinking.")
    for reasoning, message in (
        (openai_effort, "Unsupported parameter: 'reasoning_effort' is not supported with this model."),
        (anthropic_thinking, "'demo' does not support thinking."),
    ):
        with pytest.raises(BodyError) as refused:
            check(Generation(kind="chat", reasoning=reasoning), reasoning_parser=False)
        assert refused.value.message == message and refused.value.code == "unsupported_parameter"
    check(Generation(kind="chat", reasoning=Reasoning(enabled=False)), reasoning_parser=False)  # "off" runs anywhere
    with pytest.raises(BodyError) as refused:
        check(generation("auto"), tool_parser=False)
    assert refused.value.param == "tool_choice"
    check(generation("required"), tool_parser=False)  # a forced call needs no parser: structured outputs
    with pytest.raises(BodyError) as refused:
        check(Generation(kind="chat", reasoning=Reasoning(budget_tokens=10**9)))
    assert refused.value.param == "thinking_token_budget" and "context window (2048 tokens)" in refused.value.message


def check(generation: Generation, *, tool_parser: bool = True, reasoning_parser: bool = True) -> None:
    check_capabilities(
        generation, model="demo", tool_parser=tool_parser, reasoning_parser=reasoning_parser, max_model_len=2048
    )
