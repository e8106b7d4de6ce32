"""Checking an answer against its batch's checks and its line's own schema (worker/feed/checks.py)."""

from __future__ import annotations

import json
from typing import Any

from worker.feed.checks import Answer, OwnSchema, answers_of, evaluate, own_schema

SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}


def chat(content: str | None, calls: list[tuple[str, str]] = ()) -> dict[str, Any]:  # type: ignore[assignment]
    tool_calls = [{"type": "function", "function": {"name": n, "arguments": a}} for n, a in calls]
    return {"choices": [{"message": {"content": content, "tool_calls": tool_calls or None}}]}


def test_each_protocol_answer_is_read_as_text_and_tool_calls() -> None:
    assert answers_of("/v1/chat/completions", chat("hi", [("f", "{}")])) == [Answer("hi", (("f", "{}"),))]
    assert answers_of("/v1/completions", {"choices": [{"text": "a"}, {"text": "b"}]}) == [Answer("a"), Answer("b")]
    responses = {
        "output": [
            {"type": "reasoning"},
            {
                "type": "message",
                "content": [{"type": "output_text", "text": "x"}, {"type": "output_text", "text": "y"}],
            },
            {"type": "function_call", "name": "f", "arguments": '{"a": 1}'},
        ]
    }
    assert answers_of("/v1/responses", responses) == [Answer("xy", (("f", '{"a": 1}'),))]
    message = {"content": [{"type": "text", "text": "t"}, {"type": "tool_use", "name": "g", "input": {"b": 2}}]}
    assert answers_of("/v1/messages", message) == [Answer("t", (("g", {"b": 2}),))]


def test_the_line_schema_checks_the_answer_json_and_tool_arguments() -> None:
    own = OwnSchema(json_schema=SCHEMA, tools={"f": SCHEMA})
    assert evaluate({"schema": True}, own, [Answer('{"n": 3}')]) is None
    failure = evaluate({"schema": True}, own, [Answer('{"n": "three"}')])
    assert failure is not None and failure.check == "schema" and "does not match" in failure.message
    cut_off = evaluate({"schema": True}, own, [Answer('{"n": 3')])  # an answer cut at its token limit
    assert cut_off is not None and cut_off.message == "the answer is not JSON"
    call = evaluate({"schema": True}, OwnSchema(tools={"f": SCHEMA}), [Answer("", (("f", '{"m": 1}'),))])
    assert call is not None and "arguments of 'f'" in call.message
    assert evaluate({"schema": False}, own, [Answer("not json")]) is None  # the own schema check turned off
    assert evaluate({"schema": True}, OwnSchema(json_object=True), [Answer("[1]")]) is not None


def test_text_checks_fail_in_order_and_name_themselves() -> None:
    checks = {"schema": True, "enum": ["yes", "no"], "regex": "y.*", "max_length": 3}
    assert evaluate(checks, OwnSchema(), [Answer(" yes ")]) is not None  # enum strips, the regex does not
    assert evaluate({"enum": ["yes", "no"]}, OwnSchema(), [Answer(" yes\n")]) is None
    assert evaluate(checks, OwnSchema(), [Answer("no")]).check == "regex"  # type: ignore[union-attr]
    assert evaluate(checks, OwnSchema(), [Answer("maybe")]).check == "enum"  # type: ignore[union-attr]
    assert evaluate({"max_length": 3}, OwnSchema(), [Answer("four")]).check == "max_length"  # type: ignore[union-attr]
    assert evaluate({"regex": "ab"}, OwnSchema(), [Answer("abc")]) is not None  # the whole text must match
    assert evaluate({"json_schema": SCHEMA}, OwnSchema(), [Answer(json.dumps({"n": 1}))]) is None
    assert evaluate({"regex": "a"}, OwnSchema(), [Answer("a"), Answer("b")]) is not None  # every choice


def test_a_line_own_schema_comes_from_its_body_and_an_unparseable_body_has_none() -> None:
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": "hi"}],
        "response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": SCHEMA}},
    }
    assert own_schema("/v1/chat/completions", body).json_schema == SCHEMA
    json_mode = {**body, "response_format": {"type": "json_object"}}
    assert own_schema("/v1/chat/completions", json_mode).json_object
    assert own_schema("/v1/chat/completions", {"model": "m"}) == OwnSchema()


def test_a_schema_the_validator_cannot_apply_fails_the_answer_instead_of_raising() -> None:
    remote = {"$ref": "http://169.254.169.254/schema.json"}  # never fetched
    failure = evaluate({"json_schema": remote}, OwnSchema(), [Answer("{}")])
    assert failure is not None and "could not be checked" in failure.message
