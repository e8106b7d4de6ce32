"""Checking an answer (docs/workflow.md, "Checked answers"): the checks a batch was created with
(storage/batches/checks.py) against one line's answer, in the line's protocol.

The line's own schema (`schema`, on by default) is its `response_format` / `text.format` / `output_config` JSON
schema or JSON object, and each tool call's arguments against that tool's parameters. Constrained decoding already
makes a schema-shaped answer parse and match its schema (vLLM's structured outputs), so on a real engine this
check catches what decoding cannot: an answer cut off by its token limit, or a tool answer that is not JSON.
The text checks (`json_schema`, `regex`, `enum`, `max_length`) read each choice's text (empty when it only
calls tools); a regex must match the whole text.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from jsonschema.validators import validator_for

from storage.endpoints import CHAT_URL, COMPLETIONS_URL, MESSAGES_URL, RESPONSES_URL
from worker.engine.wire import parse
from worker.engine.wire.base import BodyError

_SHOWN = 200  # characters of a failure's detail kept in its message


@dataclass(frozen=True)
class Failure:
    """The first check an answer failed, and why."""

    check: str
    message: str


@dataclass(frozen=True)
class Answer:
    """One choice of an answer: its text and its tool calls (name, arguments as generated)."""

    text: str
    calls: tuple[tuple[str, Any], ...] = ()


@dataclass(frozen=True)
class OwnSchema:
    """What the line itself asked its answer to be: a JSON schema, any JSON object, its tools' parameters."""

    json_schema: dict[str, Any] | None = None
    json_object: bool = False
    tools: dict[str, dict[str, Any]] = field(default_factory=dict)


def own_schema(url: str, body: dict[str, Any]) -> OwnSchema:
    """The line's own structured-output schema and tool parameters (none when its body does not parse: the engine
    refuses it with its own error)."""
    try:
        generation = parse(url, body).generation
    except (BodyError, ValueError, TypeError):
        return OwnSchema()
    constraint = generation.constraint
    return OwnSchema(
        json_schema=None if constraint is None else constraint.json_schema,
        json_object=constraint is not None and constraint.json_schema is None,
        tools={tool.name: tool.parameters for tool in generation.tools},
    )


def answers_of(url: str, body: dict[str, Any]) -> list[Answer]:
    """Each choice of a protocol's answer body as text and tool calls."""
    if url in (CHAT_URL, COMPLETIONS_URL):
        return [_choice(choice) for choice in body.get("choices") or []]
    if url == RESPONSES_URL:
        items = body.get("output") or []
        text = "".join(
            part.get("text", "")
            for item in items
            if item.get("type") == "message"
            for part in item.get("content") or []
            if part.get("type") == "output_text"
        )
        calls = tuple((i.get("name", ""), i.get("arguments")) for i in items if i.get("type") == "function_call")
        return [Answer(text, calls)]
    if url == MESSAGES_URL:
        blocks = body.get("content") or []
        text = "".join(block.get("text", "") for block in blocks if block.get("type") == "text")
        calls = tuple((b.get("name", ""), b.get("input")) for b in blocks if b.get("type") == "tool_use")
        return [Answer(text, calls)]
    return []


def _choice(choice: dict[str, Any]) -> Answer:
    if "text" in choice:  # a completion
        return Answer(choice.get("text") or "")
    message = choice.get("message") or {}
    calls = tuple(
        ((call.get("function") or {}).get("name", ""), (call.get("function") or {}).get("arguments"))
        for call in message.get("tool_calls") or []
    )
    return Answer(message.get("content") or "", calls)


def evaluate(checks: dict[str, Any], own: OwnSchema, answers: list[Answer]) -> Failure | None:
    """The first check any choice fails (in the order schema, json_schema, enum, regex, max_length), or None."""
    for answer in answers:
        for failure in _failures(checks, own, answer):
            return failure
    return None


def _failures(checks: dict[str, Any], own: OwnSchema, answer: Answer) -> Iterator[Failure]:
    if checks.get("schema", True):
        yield from _own(own, answer)
    if (schema := checks.get("json_schema")) is not None:
        yield from _json(answer.text, schema, check="json_schema")
    if (values := checks.get("enum")) is not None and answer.text.strip() not in values:
        yield Failure("enum", f"the answer {_clip(answer.text.strip())!r} is none of the {len(values)} values")
    if (pattern := checks.get("regex")) is not None and re.fullmatch(pattern, answer.text) is None:
        yield Failure("regex", f"the answer {_clip(answer.text)!r} does not match the pattern")
    if (limit := checks.get("max_length")) is not None and len(answer.text) > limit:
        yield Failure("max_length", f"the answer has {len(answer.text)} characters, more than {limit}")


def _own(own: OwnSchema, answer: Answer) -> Iterator[Failure]:
    if own.json_schema is not None:
        yield from _json(answer.text, own.json_schema, check="schema")
    elif own.json_object:
        yield from _json(answer.text, {"type": "object"}, check="schema")
    for name, arguments in answer.calls:
        if name in own.tools:
            yield from _json(arguments, own.tools[name], check="schema", what=f"the arguments of {name!r}")


def _json(value: Any, schema: dict[str, Any], *, check: str, what: str = "the answer") -> Iterator[Failure]:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            yield Failure(check, f"{what} is not JSON")
            return
    try:
        error = next(iter(validator_for(schema)(schema).iter_errors(value)), None)
    except Exception as failed:  # a schema the validator cannot apply ($ref elsewhere, ...): the answer fails it
        yield Failure(check, f"{what} could not be checked against the schema ({type(failed).__name__})")
        return
    if error is not None:
        yield Failure(check, f"{what} does not match the schema: {_clip(error.message)}")


def _clip(text: str) -> str:
    return text if len(text) <= _SHOWN else text[:_SHOWN] + "…"
