"""Anthropic's tools and thinking in a Messages request: client tools and the tool choice, `tool_use` and
`tool_result` blocks in the conversation, `thinking` (enabled with a budget, adaptive, disabled); and the blocks an
answer carries (`thinking`, `tool_use`) with its `tool_use` stop reason.

Server tools (web search and fetch, code execution, bash, text editor, computer use, memory, tool search, ...)
are run by Anthropic or follow schemas Claude was trained on; this server runs only the model, so a request that
declares one is errored, naming it. A `thinking` block's `signature` is the SHA-256 digest of its text, base64:
a checksum, not a proof of origin (this server holds no key to sign with); thinking blocks passed back in a
conversation are accepted without checking it, and earlier turns' thinking is not rendered (as templates drop it).
"""

from __future__ import annotations

import base64
import hashlib
import json
from typing import Any, Literal

from pydantic import Field, model_validator

from worker.engine.generation import BodyError, Generated, Reasoning, Tool, ToolChoice
from worker.engine.tools import MAX_TOOLS
from worker.engine.wire.anthropic import content
from worker.engine.wire.base import Strict

MIN_THINKING_BUDGET = 1024  # Anthropic's minimum `budget_tokens`
BLOCK_TYPES = ("text", "tool_use", "tool_result", "thinking", "redacted_thinking")


class MessagesTool(Strict):
    """A client tool: the model's calls of it come back as `tool_use` blocks for the caller to run."""

    name: str = Field(pattern=r"^[a-zA-Z0-9_-]{1,128}$")
    input_schema: dict[str, Any]
    description: str | None = None
    type: Literal["custom"] | None = None
    strict: bool | None = None
    cache_control: dict[str, Any] | None = None  # accepted: the engine's prefix cache needs no marks
    input_examples: list[dict[str, Any]] | None = None  # accepted, not rendered
    eager_input_streaming: bool | None = None  # streaming only: nothing to do in a batch
    allowed_callers: list[Literal["direct"]] | None = None
    defer_loading: Literal[False] | None = None  # deferred loading needs Anthropic's tool search

    @model_validator(mode="after")
    def _object_schema(self) -> MessagesTool:
        if self.input_schema.get("type") != "object":
            raise ValueError("input_schema: Input should be a JSON schema of type 'object'")
        return self

    def tool(self) -> Tool:
        return Tool(self.name, self.description, self.input_schema, bool(self.strict))


class MessagesToolChoice(Strict):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None

    @model_validator(mode="after")
    def _named(self) -> MessagesToolChoice:
        if (self.type == "tool") != (self.name is not None):
            raise ValueError("'name' is required with type 'tool', and only with it")
        return self


class MessagesThinking(Strict):
    type: Literal["enabled", "adaptive", "disabled"]
    budget_tokens: int | None = Field(default=None, ge=MIN_THINKING_BUDGET)
    display: Literal["summarized", "omitted"] | None = None

    @model_validator(mode="after")
    def _budgeted(self) -> MessagesThinking:
        if (self.type == "enabled") != (self.budget_tokens is not None):
            raise ValueError("'budget_tokens' is required with type 'enabled', and only with it")
        return self


class ToolUseBlock(Strict):
    """A call an earlier assistant turn made."""

    type: Literal["tool_use"]
    id: str
    name: str
    input: dict[str, Any]
    cache_control: dict[str, Any] | None = None
    caller: dict[str, Any] | None = None


class ToolResultText(Strict):
    type: Literal["text"]
    text: str
    cache_control: dict[str, Any] | None = None
    citations: list[Any] | None = Field(default=None, max_length=0)


class ToolResultBlock(Strict):
    """The result of a call, in a user turn."""

    type: Literal["tool_result"]
    tool_use_id: str
    content: str | list[ToolResultText] | None = None
    is_error: bool | None = None
    cache_control: dict[str, Any] | None = None

    def text(self) -> str:
        if self.content is None or isinstance(self.content, str):
            return self.content or ""
        return "\n".join(part.text for part in self.content)


class ThinkingBlock(Strict):
    """An earlier answer's thinking passed back: accepted, not rendered."""

    type: Literal["thinking"]
    thinking: str
    signature: str
    cache_control: dict[str, Any] | None = None


class RedactedThinkingBlock(Strict):
    type: Literal["redacted_thinking"]
    data: str


def check_tools(value: Any) -> Any:
    """Refuse server tools by name, and too many tools, before the field is validated (a BodyError passes through
    pydantic unwrapped)."""
    if not isinstance(value, list):
        return value
    if len(value) > MAX_TOOLS:
        raise BodyError(
            f"tools: List should have at most {MAX_TOOLS} items, not {len(value)}", code="invalid_value", param="tools"
        )
    for index, tool in enumerate(value):
        kind = tool.get("type") if isinstance(tool, dict) else None
        if kind not in (None, "custom"):
            raise BodyError(
                f"tools.{index}: tool type {kind!r} is not supported by this server: it runs client tools only "
                "(their calls come back as tool_use blocks for you to run); server tools such as web search and "
                "fetch, code execution, bash, text editor, computer use and memory are not available",
                code="unsupported_tool",
                param="tools",
            )
    return value


def tool_setup(
    tools: list[MessagesTool] | None, choice: MessagesToolChoice | None
) -> tuple[tuple[Tool, ...], ToolChoice]:
    """The request's tools and tool choice in neutral terms."""
    declared = tuple(tool.tool() for tool in tools or [])
    parallel = not (choice is not None and choice.disable_parallel_tool_use)
    if choice is None:
        return declared, ToolChoice(mode="auto" if declared else "none", parallel=parallel)
    if choice.type != "none" and not declared:
        raise BodyError(f"tool_choice: type '{choice.type}' needs tools", code="invalid_value", param="tool_choice")
    if choice.type == "tool" and choice.name not in {tool.name for tool in declared}:
        raise BodyError(
            f"tool_choice.name: tool {choice.name!r} is not among the request's tools",
            code="invalid_value",
            param="tool_choice",
        )
    mode: Literal["auto", "none", "required", "named"] = {  # type: ignore[assignment]
        "auto": "auto",
        "any": "required",
        "tool": "named",
        "none": "none",
    }[choice.type]
    return declared, ToolChoice(mode=mode, name=choice.name, parallel=parallel)


def check_budget(thinking: MessagesThinking | None, *, max_tokens: int) -> None:
    """A thinking budget must leave room for the answer: less than `max_tokens`, as Anthropic requires."""
    if thinking is not None and thinking.budget_tokens is not None and thinking.budget_tokens >= max_tokens:
        raise BodyError(
            f"max_tokens must be greater than thinking.budget_tokens ({max_tokens} <= {thinking.budget_tokens})",
            code="invalid_value",
            param="thinking",
        )


def reasoning_of(thinking: MessagesThinking | None, *, effort: str | None = None) -> Reasoning | None:
    """`thinking` as a neutral switch (None: the model's default); `output_config.effort` goes to the chat template
    as a reasoning effort when the model thinks (docs/anthropic.md)."""
    if thinking is None:
        return None
    return Reasoning(
        enabled=thinking.type != "disabled",
        budget_tokens=thinking.budget_tokens,
        effort=effort if thinking.type != "disabled" else None,
        param="thinking",
        budget_param="thinking.budget_tokens",
        refusal="'{model}' does not support thinking.",
    )


def turn_messages(role: str, blocks: list[Any]) -> list[dict[str, Any]]:
    """One turn's blocks as chat messages vLLM's renderer takes: a user turn's tool results become tool messages
    (before its text, as Anthropic orders them), an assistant turn's calls the `tool_calls` of its message."""
    texts = [block.text for block in blocks if getattr(block, "type", None) == "text"]
    if role == "assistant":
        calls = [
            {
                "id": block.id,
                "type": "function",
                "function": {"name": block.name, "arguments": json.dumps(block.input, ensure_ascii=False)},
            }
            for block in blocks
            if isinstance(block, ToolUseBlock)
        ]
        message: dict[str, Any] = {"role": "assistant", "content": "\n".join(texts)}
        return [message | {"tool_calls": calls}] if calls else [message]
    results = [
        {"role": "tool", "tool_call_id": block.tool_use_id, "content": _result_text(block)}
        for block in blocks
        if isinstance(block, ToolResultBlock)
    ]
    user = content.user_content(blocks)  # text, images and documents (wire/anthropic/content.py)
    return results + ([{"role": "user", "content": user or ""}] if user is not None or not results else [])


def _result_text(block: ToolResultBlock) -> str:
    return f"Error: {block.text()}" if block.is_error else block.text()


def answer_blocks(sequence: Generated, *, omit_thinking: bool) -> list[dict[str, Any]]:
    """An answer's content blocks: its thinking (with a signature), its text, its tool_use blocks."""
    blocks: list[dict[str, Any]] = []
    if sequence.reasoning is not None:
        thinking = "" if omit_thinking else sequence.reasoning
        blocks.append({"type": "thinking", "thinking": thinking, "signature": signature(sequence.reasoning)})
    if sequence.text:
        blocks.append({"type": "text", "text": sequence.text})
    for call in sequence.tool_calls:
        blocks.append(
            {"type": "tool_use", "id": f"toolu_{call.id}", "name": call.name, "input": _input(call.arguments)}
        )
    return blocks


def _input(arguments: str) -> dict[str, Any]:
    """A call's arguments as the `input` object (empty when they do not parse: an answer cut short)."""
    try:
        value = json.loads(arguments, strict=False)
    except (ValueError, RecursionError):
        return {}
    return value if isinstance(value, dict) else {}


def signature(thinking: str) -> str:
    """A thinking block's signature: the base64 SHA-256 digest of its text (a checksum; see the module docstring)."""
    return base64.b64encode(hashlib.sha256(thinking.encode()).digest()).decode()
