"""Anthropic Messages (/v1/messages) request bodies in, Anthropic `Message` bodies out.

An Anthropic Message Batch request's `params`, run as a neutral chat `Generation` by every engine and answered
as Anthropic's `Message` (`message_reply`). What the
engine cannot do (tools, images, thinking, streaming) is refused per request: it becomes an `errored`
result with `invalid_request_error`, never a failed batch.
"""

from __future__ import annotations

import uuid
from typing import Annotated, Any, Literal

from pydantic import Discriminator, Field, Tag, ValidationError, field_validator, model_validator

from worker.engine import EngineResult
from worker.engine.generation import Generation, Output, OutputLimit, Sampling
from worker.engine.wire.anthropic import content, formats
from worker.engine.wire.anthropic import tools as tooling
from worker.engine.wire.base import TYPE_TAGS, BodyError, Parsed, Reply, Strict

MAX_MESSAGES_STOP_SEQUENCES = 64
MAX_METADATA_USER_ID_CHARS = 256

# Anthropic parameters accepted only at their "off" value.
_MESSAGES_OFF_VALUES: dict[str, tuple[Any, ...]] = {
    "stream": (None, False),
    "mcp_servers": (None, []),
    "container": (None,),
    "service_tier": (None, "auto", "standard_only"),  # every request here runs at batch priority
}


def _text_blocks_only(value: Any, where: str, allowed: tuple[str, ...] = ("text",)) -> Any:
    """Name the first block of another type plainly, instead of pydantic's union-of-everything message."""
    if isinstance(value, list):
        for index, block in enumerate(value):
            kind = block.get("type") if isinstance(block, dict) else None
            if kind not in allowed:
                raise ValueError(
                    f"{where}.{index}: only {', '.join(allowed)} content blocks are supported here, got {kind!r}"
                )
    return value


class MessagesTextBlock(Strict):
    type: Literal["text"]
    text: str
    # Accepted and ignored: the engine's prefix cache serves a repeated prompt prefix without being asked.
    cache_control: dict[str, Any] | None = None
    citations: list[Any] | None = Field(default=None, max_length=0)


def _block_type(value: Any) -> str:
    found = value.get("type") if isinstance(value, dict) else getattr(value, "type", None)
    return str(found)


# A content block of a turn: text, or a tool call / its result / thinking passed back (wire/anthropic/tools.py).
MessagesBlock = Annotated[
    Annotated[MessagesTextBlock, Tag("text")]
    | Annotated[tooling.ToolUseBlock, Tag("tool_use")]
    | Annotated[tooling.ToolResultBlock, Tag("tool_result")]
    | Annotated[tooling.ThinkingBlock, Tag("thinking")]
    | Annotated[tooling.RedactedThinkingBlock, Tag("redacted_thinking")]
    | Annotated[content.ImageBlock, Tag("image")]  # images and documents: wire/anthropic/content.py
    | Annotated[content.DocumentBlock, Tag("document")],
    Discriminator(_block_type),
]


class MessagesTurn(Strict):
    role: Literal["user", "assistant"]
    content: str | list[MessagesBlock]

    @field_validator("content", mode="before")
    @classmethod
    def _text(cls, value: Any) -> Any:
        return _text_blocks_only(value, "content", (*tooling.BLOCK_TYPES, "image", "document"))

    def blocks(self) -> list[Any]:
        return [MessagesTextBlock(type="text", text=self.content)] if isinstance(self.content, str) else self.content


class MessagesMetadata(Strict):
    user_id: str | None = Field(default=None, max_length=MAX_METADATA_USER_ID_CHARS)


class MessagesBody(Strict):
    """Anthropic's Messages parameters that a text-only engine can honour."""

    model: str
    max_tokens: int = Field(ge=1)
    messages: list[MessagesTurn] = Field(min_length=1)
    system: str | list[MessagesTextBlock] | None = None
    stop_sequences: list[str] | None = Field(default=None, max_length=MAX_MESSAGES_STOP_SEQUENCES)
    temperature: float | None = Field(default=None, ge=0, le=1)
    top_p: float | None = Field(default=None, gt=0, le=1)
    top_k: int | None = Field(default=None, ge=0)
    metadata: MessagesMetadata | None = None
    cache_control: dict[str, Any] | None = None  # accepted and ignored, as on text blocks
    tools: list[tooling.MessagesTool] | None = None
    tool_choice: tooling.MessagesToolChoice | None = None
    thinking: tooling.MessagesThinking | None = None
    output_config: formats.OutputConfig | None = None  # structured output (wire/anthropic/formats.py)
    output_format: formats.JsonOutputFormat | None = None  # the structured-outputs beta's spelling of it

    @field_validator("tools", mode="before")
    @classmethod
    def _client_tools(cls, value: Any) -> Any:
        return tooling.check_tools(value)

    @model_validator(mode="after")
    def _thinking_fits(self) -> MessagesBody:
        tooling.check_budget(self.thinking, max_tokens=self.max_tokens)
        return self

    @field_validator("system", mode="before")
    @classmethod
    def _system_text(cls, value: Any) -> Any:
        return _text_blocks_only(value, "system")

    @field_validator("stop_sequences")
    @classmethod
    def _stops_not_blank(cls, value: list[str] | None) -> list[str] | None:
        if value and any(not stop.strip() for stop in value):
            raise ValueError("each stop sequence must contain non-whitespace")
        return value

    @property
    def prefill(self) -> bool:
        """A final assistant turn: the answer continues it (Anthropic's prefill)."""
        return self.messages[-1].role == "assistant"

    def conversation(self) -> list[dict[str, Any]]:
        """System first, then the turns; consecutive turns of one role are combined, as Anthropic does (tool calls
        and results become chat's tool calls and tool messages: wire/anthropic/tools.py)."""
        turns: list[tuple[str, list[Any]]] = []
        for turn in self.messages:
            if turns and turns[-1][0] == turn.role:
                turns[-1][1].extend(turn.blocks())
            else:
                turns.append((turn.role, turn.blocks()))
        system = [self.system] if isinstance(self.system, str) else [block.text for block in self.system or []]
        head = [{"role": "system", "content": "\n".join(system)}] if system else []
        return head + [message for role, blocks in turns for message in tooling.turn_messages(role, blocks)]

    def generation(self) -> Generation:
        """What an engine runs for these Messages: a chat that stops at the context's end rather than refusing
        a `max_tokens` it cannot hold, continuing a final assistant turn (a prefill)."""
        tools, choice = tooling.tool_setup(self.tools, self.tool_choice)
        return Generation(
            kind="chat",
            messages=tuple(self.conversation()),
            continue_final=self.prefill,
            limit=OutputLimit(requested=self.max_tokens, name="max_tokens", clamp=True),
            sampling=Sampling(
                temperature=self.temperature,
                top_p=self.top_p,
                top_k=self.top_k or None,
                stop=tuple(self.stop_sequences or ()),
            ),
            tools=tools,
            tool_choice=choice,
            reasoning=tooling.reasoning_of(
                self.thinking, effort=self.output_config.effort if self.output_config else None
            ),
            constraint=formats.constraint_of(self.output_config, self.output_format, prefill=self.prefill),
        )


def message_reply(body: MessagesBody) -> Reply:
    """Anthropic's `Message` for an engine's output: its thinking, text and tool calls, why it stopped, its usage
    (thinking counts as output, as Anthropic bills it)."""
    omitted = body.thinking is not None and body.thinking.display == "omitted"

    def reply(output: Output, model: str) -> EngineResult:
        sequence = output.sequences[0]
        stop = anthropic_stop(
            finish_reason=sequence.finish_reason,
            matched=sequence.matched,
            output_tokens=sequence.token_count,
            max_tokens=body.max_tokens,
        )
        if output.cut_by is not None:  # cut short by its batch's expiry: the SDKs' "max_tokens" (docs/workflow.md)
            stop = ("max_tokens", None)
        message = anthropic_message(
            message_id=output.response_id or uuid.uuid4().hex[:24],
            model=model,
            text=sequence.text,
            stop=stop,
            prompt_tokens=output.prompt_tokens,
            output_tokens=sequence.token_count,
            cached_tokens=output.cached_tokens,
            content=tooling.answer_blocks(sequence, omit_thinking=omitted),
        )
        return EngineResult(
            output.request_id,
            200,
            message,
            prompt_tokens=output.prompt_tokens,
            completion_tokens=sequence.token_count,
            cached_tokens=output.cached_tokens,
            reasoning_tokens=sequence.reasoning_tokens,
        )

    return reply


def parse_messages(body: Any) -> Parsed:
    """An Anthropic request's `params` as what an engine runs and how it is answered; BodyError if it cannot run."""
    parsed = parse_messages_body(body)
    return Parsed(parsed.generation(), message_reply(parsed))


def parse_messages_body(body: Any) -> MessagesBody:
    """Validate an Anthropic Messages request; what cannot run raises BodyError (an errored result)."""
    if not isinstance(body, dict):
        raise BodyError("params: must be an object", code="invalid_type", param="params")
    fields = dict(body)
    for name, allowed in _MESSAGES_OFF_VALUES.items():
        if name in fields:
            value = fields.pop(name)
            if not any(value == ok and type(value) is type(ok) for ok in allowed):
                raise BodyError(
                    f"{name}: not supported by this server (text generation only)",
                    code="unsupported_parameter",
                    param=name,
                )
    try:
        return MessagesBody.model_validate(fields)
    except ValidationError as error:
        raise _describe_messages(error) from None


def _describe_messages(error: ValidationError) -> BodyError:
    errors = error.errors(include_url=False)
    # A union (`content: str | list[...]`) reports its string branch first; a list's own problem says more.
    first = next((e for e in errors if not (e["loc"] and e["loc"][-1] == "str")), errors[0])
    parts = [str(p) for p in first["loc"] if str(p) not in TYPE_TAGS and not str(p).startswith(("list[", "Messages"))]
    where = ".".join(parts) or "params"
    param = parts[0] if parts else None
    if first["type"] == "extra_forbidden":
        return BodyError(f"{where}: not supported by this server", code="unsupported_parameter", param=param)
    if first["type"] == "missing":
        return BodyError(f"{where}: Field required", code="missing_required_parameter", param=param)
    message = str(first["msg"]).removeprefix("Value error, ")
    return BodyError(f"{where}: {message}", code="invalid_value", param=param)


def anthropic_stop(*, finish_reason: str, matched: Any, output_tokens: int, max_tokens: int) -> tuple[str, str | None]:
    """(stop_reason, stop_sequence): the engine's finish reason and matched stop string in Anthropic's terms.

    `matched` is what vLLM reports as `stop_reason`: the stop string that ended the text, a stop token id,
    or None (end of sequence). A length stop short of `max_tokens` hit the model's context window.
    """
    if finish_reason == "length":
        return ("max_tokens", None) if output_tokens >= max_tokens else ("model_context_window_exceeded", None)
    if finish_reason == "tool_calls":
        return "tool_use", None
    if isinstance(matched, str):
        return "stop_sequence", matched
    return "end_turn", None


def anthropic_message(
    *,
    message_id: str,
    model: str,
    text: str,
    stop: tuple[str, str | None],
    prompt_tokens: int,
    output_tokens: int,
    cached_tokens: int = 0,
    content: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """Anthropic's `Message` (`content`: its blocks, else one text block of `text`). `input_tokens` leaves out what
    the prefix cache served, which is reported as `cache_read_input_tokens` (Anthropic: total input = input + cache
    creation + cache read)."""
    cached = max(0, min(cached_tokens, prompt_tokens))
    return {
        "id": message_id if message_id.startswith("msg_") else f"msg_{message_id}",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content if content is not None else ([{"type": "text", "text": text}] if text else []),
        "stop_reason": stop[0],
        "stop_sequence": stop[1],
        "usage": {
            "input_tokens": prompt_tokens - cached,
            "output_tokens": output_tokens,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": cached,
        },
    }
