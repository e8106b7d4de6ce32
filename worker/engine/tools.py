"""Tool calls in no protocol's words: what a tool choice constrains an answer to, the calls a constrained answer
holds, call ids, and which models may be asked for tools or thinking at all. Engines and wire modules share it;
nothing here names a protocol or imports vLLM.

A forced choice (`required`, or one named tool) is enforced with structured outputs, as vLLM's own server does
(vllm/tool_parsers/utils.py `get_json_schema_from_tools`): a named tool's answer is its arguments object (the
tool's parameters schema); a required call's is a list of {"name", "parameters"} objects, each one of the tools
(one item at most when parallel calls are off). The answer is read back as calls here, whatever the model's own
tool-call format, so the arguments always parse against the tool's schema. Arguments are re-serialised: a grammar
may let raw control characters into a JSON string (xgrammar does), which `json.loads` refuses by default.
"""

from __future__ import annotations

import copy
import hashlib
import json
import secrets
import string
from collections.abc import Iterator
from typing import Any

from worker.engine.generation import BodyError, Generation, ToolCall

MAX_TOOLS = 128  # tools one request may declare (OpenAI's limit; a template renders every one into the prompt)
_ID_ALPHABET = string.ascii_letters + string.digits
_ID_CHARS = 24


def forced_schema(generation: Generation) -> dict[str, Any] | None:
    """The JSON schema a forced tool choice holds the answer to (None: the choice forces nothing)."""
    choice = generation.tool_choice
    if not generation.tools or not choice.forced:
        return None
    if choice.mode == "named":
        tool = next(tool for tool in generation.tools if tool.name == choice.name)  # the wire module checked it
        return _object_schema(tool.parameters)
    defs: dict[str, Any] = {}
    calls = []
    for tool in generation.tools:
        parameters = copy.deepcopy(_object_schema(tool.parameters))
        for name, definition in (parameters.pop("$defs", None) or {}).items():
            if defs.setdefault(name, definition) != definition:
                raise BodyError(
                    f"tools: two tools define '$defs.{name}' differently; a required tool choice needs one schema "
                    "per definition name",
                    code="invalid_value",
                    param="tools",
                )
        calls.append(
            {
                "type": "object",
                "properties": {"name": {"type": "string", "enum": [tool.name]}, "parameters": parameters},
                "required": ["name", "parameters"],
            }
        )
    schema: dict[str, Any] = {"type": "array", "minItems": 1, "items": {"anyOf": calls}}
    if not choice.parallel:
        schema["maxItems"] = 1
    if defs:
        schema["$defs"] = defs
    return schema


def _object_schema(parameters: dict[str, Any]) -> dict[str, Any]:
    return parameters or {"type": "object", "properties": {}}


def forced_calls(text: str, generation: Generation, ids: Iterator[str]) -> list[ToolCall] | None:
    """The calls a forced choice's constrained answer holds; None when it does not parse (cut short)."""
    choice = generation.tool_choice
    value = _loads(text)
    if value is None:
        return None
    if choice.mode == "named":
        if not isinstance(value, dict):
            return None
        return [ToolCall(next(ids), str(choice.name), _dumps(value))]
    if not isinstance(value, list) or not all(isinstance(item, dict) and "name" in item for item in value):
        return None
    return [ToolCall(next(ids), str(item["name"]), _dumps(item.get("parameters") or {})) for item in value]


def normalized_arguments(text: str) -> str:
    """A call's arguments as strict JSON text when they parse (control characters escaped), else as written."""
    value = _loads(text)
    return text if value is None else _dumps(value)


def _loads(text: str) -> Any:
    try:
        return json.loads(text, strict=False)  # strict=False: raw control characters inside strings
    except (ValueError, RecursionError):
        return None


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def random_ids() -> Iterator[str]:
    """Fresh call ids (24 letters and digits; each protocol adds its prefix: `call_`, `toolu_`)."""
    while True:
        yield "".join(secrets.choice(_ID_ALPHABET) for _ in range(_ID_CHARS))


def derived_ids(seed: str) -> Iterator[str]:
    """Call ids derived from `seed` (a deterministic engine's), in the same alphabet as `random_ids`."""
    index = 0
    while True:
        digest = int(hashlib.sha256(f"{seed}/call/{index}".encode()).hexdigest(), 16)
        chars = []
        for _ in range(_ID_CHARS):
            digest, position = divmod(digest, len(_ID_ALPHABET))
            chars.append(_ID_ALPHABET[position])
        yield "".join(chars)
        index += 1


def check_capabilities(
    generation: Generation, *, model: str, tool_parser: bool, reasoning_parser: bool, max_model_len: int
) -> None:
    """Refuse what this model cannot do: thinking without a reasoning parser (as each vendor answers for its
    own models that cannot think), a thinking budget beyond its context, `auto` tool calls without a tool-call
    parser (forced calls need none)."""
    reasoning = generation.reasoning
    if reasoning is not None and reasoning.enabled and not reasoning_parser:
        raise BodyError(reasoning.refusal.format(model=model), code="unsupported_parameter", param=reasoning.param)
    if reasoning is not None and reasoning.enabled and (reasoning.budget_tokens or 0) > max_model_len:
        raise BodyError(
            f"{reasoning.budget_param}: {reasoning.budget_tokens} is more than this model's context window "
            f"({max_model_len} tokens), which holds the prompt, the thinking and the answer",
            code="invalid_value",
            param=reasoning.budget_param,
        )
    if generation.tools and generation.tool_choice.mode == "auto" and not tool_parser:
        raise BodyError(
            f"model {model!r} has no tool-call parser (its registry entry names no `tool_parser`), so tool_choice "
            "'auto' cannot return tool calls: force a call (tool_choice 'required' or a named tool) or send "
            "tool_choice 'none'",
            code="unsupported_parameter",
            param="tool_choice",
        )


def sample_arguments(schema: Any, *, root: Any = None, depth: int = 0) -> Any:
    """A small value that satisfies simple JSON schemas (the fake engine's forced call arguments): required
    properties only, the first enum or const, minimal numbers, strings and arrays; {} past a few levels."""
    root = schema if root is None else root
    if not isinstance(schema, dict) or depth > 8:
        return {}
    if "$ref" in schema and isinstance(schema["$ref"], str) and schema["$ref"].startswith("#/$defs/"):
        found = (root.get("$defs") or {}).get(schema["$ref"].removeprefix("#/$defs/"))
        return sample_arguments(found, root=root, depth=depth + 1)
    if "const" in schema:
        return schema["const"]
    if schema.get("enum"):
        return schema["enum"][0]
    for key in ("anyOf", "oneOf", "allOf"):
        if schema.get(key):
            return sample_arguments(schema[key][0], root=root, depth=depth + 1)
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind == "string":
        return "x" * int(schema.get("minLength") or 0)
    if kind in ("integer", "number"):
        return schema.get("minimum", 0)
    if kind == "boolean":
        return False
    if kind == "null":
        return None
    if kind == "array":
        return [sample_arguments(schema.get("items"), root=root, depth=depth + 1)] * int(schema.get("minItems") or 0)
    properties = schema.get("properties") or {}
    return {
        name: sample_arguments(properties.get(name), root=root, depth=depth + 1)
        for name in schema.get("required") or []
        if isinstance(name, str)
    }
