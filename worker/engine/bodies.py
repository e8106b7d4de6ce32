"""OpenAI request bodies in, OpenAI response bodies out: shared by every Engine so they agree exactly.

Parsing is strict on purpose: a batch runs unattended, so a field we would silently ignore (`tools`,
`stream: true`, a typo) becomes a 400 on that one line instead of a surprising answer.
"""

from __future__ import annotations

import base64
import sys
import time
import uuid
from array import array
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, field_validator, model_validator

from worker.engine import EngineResult, error_result

CHAT_URL = "/v1/chat/completions"
COMPLETIONS_URL = "/v1/completions"
EMBEDDINGS_URL = "/v1/embeddings"
RESPONSES_URL = "/v1/responses"
MAX_CHOICES = 16  # `n`; each choice is a whole sequence in the engine
MAX_STOP_SEQUENCES = 4

# Fields accepted only at their "off" value, so a body that spells out a default still runs.
_OFF_VALUES: dict[str, tuple[Any, ...]] = {
    "stream": (None, False),
    "stream_options": (None,),
    "echo": (None, False),
    "suffix": (None, ""),
    "best_of": (None, 1),
    "tools": (None, []),
    "tool_choice": (None, "none"),
    "parallel_tool_calls": (None,),
    "store": (None, False),
}


class BodyError(Exception):
    """A body that cannot run: it becomes one error result, never an exception out of `add()`."""

    def __init__(self, message: str, *, code: str, param: str | None = None, status_code: int = 400) -> None:
        super().__init__(message)
        self.message, self.code, self.param, self.status_code = message, code, param, status_code

    def to_result(self, request_id: str) -> EngineResult:
        return error_result(request_id, self.status_code, self.message, code=self.code, param=self.param)


def server_error(request_id: str, message: str) -> EngineResult:
    """A 500 for one request whose sequence failed inside the engine."""
    result = error_result(request_id, 500, message, code="engine_error")
    result.body["error"]["type"] = "server_error"
    return result


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class ChatMessage(_Strict):
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[dict[str, Any]]
    name: str | None = None

    @field_validator("content")
    @classmethod
    def _text_only(cls, value: str | list[dict[str, Any]]) -> str | list[dict[str, Any]]:
        if isinstance(value, list):
            for part in value:
                if part.get("type") != "text" or not isinstance(part.get("text"), str) or len(part) != 2:
                    raise ValueError("only text content parts ({'type': 'text', 'text': ...}) are supported")
        return value

    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "\n".join(part["text"] for part in self.content)


class JsonSchemaFormat(_Strict):
    name: str
    schema_: dict[str, Any] = Field(default_factory=dict, alias="schema")
    description: str | None = None
    strict: bool | None = None


class ResponseFormat(_Strict):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class _SamplingBody(_Strict):
    model: str | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    n: int = Field(default=1, ge=1, le=MAX_CHOICES)
    stop: str | list[str] | None = Field(default=None)
    seed: int | None = None
    presence_penalty: float | None = Field(default=None, ge=-2, le=2)
    frequency_penalty: float | None = Field(default=None, ge=-2, le=2)
    logit_bias: dict[str, float] | None = None
    response_format: ResponseFormat | None = None
    ignore_eos: bool = False  # vLLM extension
    min_tokens: int = Field(default=0, ge=0)  # vLLM extension
    user: str | None = None

    @field_validator("stop")
    @classmethod
    def _few_stops(cls, value: str | list[str] | None) -> str | list[str] | None:
        if isinstance(value, list) and len(value) > MAX_STOP_SEQUENCES:
            raise ValueError(f"at most {MAX_STOP_SEQUENCES} stop sequences")
        return value

    def output_limit(self) -> int | None:
        """The requested output cap, or None for 'up to the context length'."""
        return self.max_tokens

    def requested_output(self) -> tuple[int, str] | None:
        """The output cap the body asked for explicitly, with the name of its field (None: not asked)."""
        return None if self.max_tokens is None else (self.max_tokens, "max_tokens")

    def stop_list(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])


class ChatBody(_SamplingBody):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    _limit_field: str | None = PrivateAttr(default=None)  # set when a Responses body runs as this chat body

    def output_limit(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    def requested_output(self) -> tuple[int, str] | None:
        limit = self.output_limit()
        if limit is None:
            return None
        name = self._limit_field or ("max_completion_tokens" if self.max_completion_tokens else "max_tokens")
        return limit, name

    def conversation(self) -> list[dict[str, str]]:
        """Messages flattened to role + text, the shape every chat template understands."""
        return [{"role": m.role, "content": m.text()} for m in self.messages]

    def logprob_count(self) -> int | None:
        """How many logprobs per token the engine must return (None: none)."""
        return (self.top_logprobs or 0) if self.logprobs else None


class CompletionBody(_SamplingBody):
    prompt: str | list[int] | list[str] | list[list[int]]
    logprobs: int | None = Field(default=None, ge=0, le=5)

    def output_limit(self) -> int:
        return self.max_tokens or 16  # OpenAI's default for legacy completions

    def single_prompt(self) -> str | list[int]:
        """The one prompt this line carries; a list of prompts belongs on separate lines."""
        prompt = self.prompt
        if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int):
            if len(prompt) != 1:
                raise BodyError(
                    "a list of prompts is not supported: put each prompt on its own batch line",
                    code="invalid_value",
                    param="prompt",
                )
            prompt = prompt[0]
        if not prompt:
            raise BodyError("prompt must not be empty", code="invalid_value", param="prompt")
        return prompt  # type: ignore[return-value]

    def logprob_count(self) -> int | None:
        return self.logprobs


class EmbeddingBody(_Strict):
    input: str | list[str] | list[int] | list[list[int]]
    model: str | None = None
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(default=None, ge=1)
    user: str | None = None

    def inputs(self) -> list[str | list[int]]:
        """One engine request per input: a string, or a list of token ids."""
        items: list[str | list[int]]
        if isinstance(self.input, str) or (self.input and isinstance(self.input[0], int)):
            items = [self.input]
        else:
            items = list(self.input)  # type: ignore[arg-type]
        if not items or any(len(item) == 0 for item in items):
            raise BodyError("input must not be empty", code="invalid_value", param="input")
        return items


class _InputPart(_Strict):
    """A text part of a Responses input message (`output_text` when earlier assistant output is passed back)."""

    type: Literal["input_text", "output_text"]
    text: str
    annotations: list[Any] | None = None
    logprobs: list[Any] | None = None


class ResponseInputMessage(_Strict):
    """One item of a Responses `input` list: a message with text content (images, files and tools are not run)."""

    type: Literal["message"] | None = None
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[_InputPart]
    id: str | None = None
    status: Literal["in_progress", "completed", "incomplete"] | None = None

    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "\n".join(part.text for part in self.content)


class ResponseTextFormat(_Strict):
    type: Literal["text", "json_object", "json_schema"]
    name: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    description: str | None = None
    strict: bool | None = None

    @model_validator(mode="after")
    def _schema_named(self) -> ResponseTextFormat:
        if self.type == "json_schema" and (not self.name or self.schema_ is None):
            raise ValueError("text.format of type 'json_schema' needs a 'name' and a 'schema'")
        return self


class ResponseText(_Strict):
    format: ResponseTextFormat | None = None


class ResponsesBody(_Strict):
    """A Responses API request, run on the chat path: `instructions` lead as a system message."""

    model: str | None = None
    input: str | list[ResponseInputMessage]
    instructions: str | None = None
    max_output_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    text: ResponseText | None = None
    metadata: dict[str, str] | None = None
    user: str | None = None
    truncation: Literal["disabled"] | None = None
    ignore_eos: bool = False  # vLLM extension
    min_tokens: int = Field(default=0, ge=0)  # vLLM extension

    @field_validator("input")
    @classmethod
    def _not_empty(cls, value: str | list[ResponseInputMessage]) -> str | list[ResponseInputMessage]:
        if not value:
            raise ValueError("input must not be empty")
        return value

    def as_chat(self) -> ChatBody:
        """The chat body this request amounts to: what every engine runs."""
        messages = [{"role": "system", "content": self.instructions}] if self.instructions else []
        if isinstance(self.input, str):
            messages.append({"role": "user", "content": self.input})
        else:
            messages += [{"role": item.role, "content": item.text()} for item in self.input]
        fields: dict[str, Any] = {"messages": messages, "ignore_eos": self.ignore_eos, "min_tokens": self.min_tokens}
        for name, value in (("max_tokens", self.max_output_tokens), ("temperature", self.temperature)):
            if value is not None:
                fields[name] = value
        if self.top_p is not None:
            fields["top_p"] = self.top_p
        if (fmt := self.text.format if self.text else None) is not None and fmt.type != "text":
            fields["response_format"] = {"type": fmt.type}
            if fmt.type == "json_schema":
                fields["response_format"]["json_schema"] = {
                    "name": fmt.name,
                    "schema": fmt.schema_,
                    "description": fmt.description,
                    "strict": fmt.strict,
                }
        chat = ChatBody.model_validate(fields)
        chat._limit_field = "max_output_tokens"
        return chat


Body = ChatBody | CompletionBody | EmbeddingBody | ResponsesBody
_BODY_TYPES: dict[str, type[Body]] = {
    CHAT_URL: ChatBody,
    COMPLETIONS_URL: CompletionBody,
    EMBEDDINGS_URL: EmbeddingBody,
    RESPONSES_URL: ResponsesBody,
}


def parse_body(url: str, body: Any) -> Body | MessagesBody:
    """Validate a request body for `url`; raise BodyError with an OpenAI-style message."""
    if url == MESSAGES_URL:
        return parse_messages_body(body)
    body_type = _BODY_TYPES.get(url)
    if body_type is None:
        raise BodyError(f"unsupported url {url!r}", code="unsupported_endpoint", param="url")
    if not isinstance(body, dict):
        raise BodyError("the body must be a JSON object", code="invalid_type", param="body")
    fields = dict(body)
    for name, allowed in _OFF_VALUES.items():
        if name in fields:
            value = fields.pop(name)
            if not any(value == ok and type(value) is type(ok) for ok in allowed):
                raise BodyError(
                    f"{name}={value!r} is not supported in batch requests", code="unsupported_parameter", param=name
                )
    try:
        return body_type.model_validate(fields)
    except ValidationError as error:
        raise _describe(error) from None


_TYPE_TAGS = {"str", "int", "float", "bool", "dict", "list", "function-after"}


def _describe(error: ValidationError) -> BodyError:
    first = error.errors(include_url=False)[0]
    # Union members add their type name to `loc` ("prompt.str"); the user wants the field path.
    where = ".".join(str(part) for part in first["loc"] if str(part) not in _TYPE_TAGS and "[" not in str(part))
    param = str(first["loc"][0]) if first["loc"] else None
    if first["type"] == "extra_forbidden":
        return BodyError(f"unsupported parameter {where!r}", code="unsupported_parameter", param=param)
    if first["type"] == "missing":
        return BodyError(f"missing required parameter {where!r}", code="missing_required_parameter", param=param)
    return BodyError(f"invalid value for {where!r}: {first['msg']}", code="invalid_value", param=param)


@dataclass
class Choice:
    """One generated sequence, engine-neutral: its text, why it stopped, and OpenAI-shaped logprobs."""

    text: str
    finish_reason: str
    token_count: int
    logprobs: dict[str, Any] | None = None


def engine_body(body: Body) -> ChatBody | CompletionBody | EmbeddingBody:
    """What an engine runs for `body`: a Responses request runs as the chat request it amounts to."""
    return body.as_chat() if isinstance(body, ResponsesBody) else body


def output_budget(
    body: ChatBody | CompletionBody, *, prompt_tokens: int, max_model_len: int, default: int | None = None
) -> int:
    """The output cap to run with: what the body asked for, else `default`, else the rest of the context.

    Asking for more than the context leaves is a 400 with OpenAI's message (`context_length_exceeded`), as
    OpenAI and vLLM's server answer, never a silent clamp that runs and bills a request nobody asked for.
    """
    room = max_model_len - prompt_tokens
    where = "messages" if isinstance(body, ChatBody) else "prompt"
    if room < 1:
        raise BodyError(
            f"This model's maximum context length is {max_model_len} tokens, "
            f"but the prompt has {prompt_tokens} tokens, leaving no room for output.",
            code="context_length_exceeded",
            param=where,
        )
    requested = body.requested_output()
    if requested is not None and requested[0] > room:
        raise context_length_error(
            max_model_len=max_model_len, prompt_tokens=prompt_tokens, requested=requested, chat=where == "messages"
        )
    if requested is not None:
        return requested[0]
    fallback = 16 if isinstance(body, CompletionBody) else default  # OpenAI's default for legacy completions
    return min(fallback or room, room)


def context_length_error(
    *, max_model_len: int, prompt_tokens: int | None, requested: tuple[int, str], chat: bool
) -> BodyError:
    """OpenAI's 400 for a prompt plus an output cap longer than the model's context (prompt None: not counted)."""
    limit, name = requested
    where = "in the messages" if chat else "in your prompt"
    asked = (
        f"{prompt_tokens + limit} tokens ({prompt_tokens} {where}, {limit} in the completion)"
        if prompt_tokens is not None
        else f"{limit} tokens in the completion alone"
    )
    return BodyError(
        f"This model's maximum context length is {max_model_len} tokens. However, you requested {asked}. "
        f"Please reduce the length of the {'messages' if chat else 'prompt'} or completion.",
        code="context_length_exceeded",
        param=name,
    )


def generated_body(
    body: Body, *, response_id: str, model: str, choices: list[Choice], prompt_tokens: int, cached_tokens: int = 0
) -> dict[str, Any]:
    """The response body for a generated answer, in the shape of the endpoint `body` came in on."""
    if isinstance(body, ResponsesBody):
        return response_object(
            body=body, model=model, choice=choices[0], prompt_tokens=prompt_tokens, cached_tokens=cached_tokens
        )
    build = chat_completion if isinstance(body, ChatBody) else text_completion
    return build(
        response_id=response_id, model=model, choices=choices, prompt_tokens=prompt_tokens, cached_tokens=cached_tokens
    )


def response_object(
    *, body: ResponsesBody, model: str, choice: Choice, prompt_tokens: int, cached_tokens: int = 0
) -> dict[str, Any]:
    """A Responses API `response`: one assistant message of output text; `incomplete` if it hit the cap."""
    created = int(time.time())
    complete = choice.finish_reason != "length"
    fmt = body.text.format if body.text and body.text.format else None
    return {
        "id": f"resp_{uuid.uuid4().hex}",
        "object": "response",
        "created_at": created,
        "completed_at": created if complete else None,
        "status": "completed" if complete else "incomplete",
        "error": None,
        "incomplete_details": None if complete else {"reason": "max_output_tokens"},
        "instructions": body.instructions,
        "max_output_tokens": body.max_output_tokens,
        "model": model,
        "output": [
            {
                "type": "message",
                "id": f"msg_{uuid.uuid4().hex}",
                "status": "completed" if complete else "incomplete",
                "role": "assistant",
                "content": [{"type": "output_text", "text": choice.text, "annotations": [], "logprobs": []}],
            }
        ],
        "parallel_tool_calls": False,
        "temperature": body.temperature if body.temperature is not None else 1.0,
        "top_p": body.top_p if body.top_p is not None else 1.0,
        "tool_choice": "none",
        "tools": [],
        "text": {"format": fmt.model_dump(by_alias=True, exclude_none=True) if fmt else {"type": "text"}},
        "truncation": "disabled",
        "metadata": body.metadata or {},
        "user": body.user,
        "store": False,
        "background": False,
        "usage": {
            "input_tokens": prompt_tokens,
            "input_tokens_details": {"cached_tokens": cached_tokens, "cache_write_tokens": 0},
            "output_tokens": choice.token_count,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": prompt_tokens + choice.token_count,
        },
    }


def chat_completion(
    *, response_id: str, model: str, choices: list[Choice], prompt_tokens: int, cached_tokens: int = 0
) -> dict[str, Any]:
    """A `chat.completion` body."""
    return {
        "id": f"chatcmpl-{response_id}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": index,
                "message": {"role": "assistant", "content": choice.text},
                "logprobs": choice.logprobs,
                "finish_reason": choice.finish_reason,
            }
            for index, choice in enumerate(choices)
        ],
        "usage": _usage(prompt_tokens, sum(choice.token_count for choice in choices), cached_tokens),
    }


def text_completion(
    *, response_id: str, model: str, choices: list[Choice], prompt_tokens: int, cached_tokens: int = 0
) -> dict[str, Any]:
    """A `text_completion` body."""
    return {
        "id": f"cmpl-{response_id}",
        "object": "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {"index": index, "text": choice.text, "logprobs": choice.logprobs, "finish_reason": choice.finish_reason}
            for index, choice in enumerate(choices)
        ],
        "usage": _usage(prompt_tokens, sum(choice.token_count for choice in choices), cached_tokens),
    }


def embedding_list(
    *, model: str, vectors: list[list[float]], encoding_format: str, prompt_tokens: int
) -> dict[str, Any]:
    """An embeddings `list` body; base64 is little-endian float32, as OpenAI's client expects."""
    return {
        "object": "list",
        "data": [
            {"object": "embedding", "index": index, "embedding": _encode(vector, encoding_format)}
            for index, vector in enumerate(vectors)
        ],
        "model": model,
        "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens},
    }


def _encode(vector: list[float], encoding_format: str) -> list[float] | str:
    if encoding_format == "float":
        return vector
    packed = array("f", vector)
    if sys.byteorder == "big":
        packed.byteswap()
    return base64.b64encode(packed.tobytes()).decode("ascii")


def _usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    }


# -- Anthropic Messages (/v1/messages) ---------------------------------------------------------------
# An Anthropic Message Batch request's `params`, run on the chat path of every engine (`as_chat()`, or
# `chat_payload()` for a vLLM server) and answered as Anthropic's `Message` (`anthropic_message`). What the
# engine cannot do (tools, images, thinking, streaming) is refused per request: it becomes an `errored`
# result with `invalid_request_error`, never a failed batch.

MESSAGES_URL = "/v1/messages"
MAX_MESSAGES_STOP_SEQUENCES = 64
MAX_METADATA_USER_ID_CHARS = 256

# Anthropic parameters accepted only at their "off" value.
_MESSAGES_OFF_VALUES: dict[str, tuple[Any, ...]] = {
    "stream": (None, False),
    "tools": (None, []),
    "tool_choice": (None, {"type": "none"}, {"type": "auto"}),
    "thinking": (None, {"type": "disabled"}),
    "mcp_servers": (None, []),
    "container": (None,),
    "service_tier": (None, "auto", "standard_only"),  # every request here runs at batch priority
}


def _text_blocks_only(value: Any, where: str) -> Any:
    """Name the first non-text block plainly, instead of pydantic's union-of-everything message."""
    if isinstance(value, list):
        for index, block in enumerate(value):
            kind = block.get("type") if isinstance(block, dict) else None
            if kind != "text":
                raise ValueError(f"{where}.{index}: only text content blocks are supported here, got {kind!r}")
    return value


class MessagesTextBlock(_Strict):
    type: Literal["text"]
    text: str
    # Accepted and ignored: the engine's prefix cache serves a repeated prompt prefix without being asked.
    cache_control: dict[str, Any] | None = None
    citations: list[Any] | None = Field(default=None, max_length=0)


class MessagesTurn(_Strict):
    role: Literal["user", "assistant"]
    content: str | list[MessagesTextBlock]

    @field_validator("content", mode="before")
    @classmethod
    def _text(cls, value: Any) -> Any:
        return _text_blocks_only(value, "content")

    def parts(self) -> list[str]:
        return [self.content] if isinstance(self.content, str) else [block.text for block in self.content]


class MessagesMetadata(_Strict):
    user_id: str | None = Field(default=None, max_length=MAX_METADATA_USER_ID_CHARS)


class MessagesBody(_Strict):
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

    def conversation(self) -> list[dict[str, str]]:
        """System first, then the turns; consecutive turns of one role are combined, as Anthropic does."""
        turns: list[tuple[str, list[str]]] = []
        for turn in self.messages:
            if turns and turns[-1][0] == turn.role:
                turns[-1][1].extend(turn.parts())
            else:
                turns.append((turn.role, turn.parts()))
        system = [self.system] if isinstance(self.system, str) else [block.text for block in self.system or []]
        head = [{"role": "system", "content": "\n".join(system)}] if system else []
        return head + [{"role": role, "content": "\n".join(parts)} for role, parts in turns]

    def as_chat(self) -> ChatBody:
        """The same request as a chat body (already validated here, so it is built, not re-validated)."""
        turns: list[dict[str, Any]] = list(self.conversation())
        messages = [ChatMessage.model_construct(**turn) for turn in turns]
        return ChatBody.model_construct(
            messages=messages,
            max_tokens=self.max_tokens,
            temperature=self.temperature,
            top_p=self.top_p,
            stop=list(self.stop_sequences or []),
        )

    def chat_payload(self) -> dict[str, Any]:
        """The request for a vLLM server's /v1/chat/completions (vLLM takes top_k and prefill as extras)."""
        payload: dict[str, Any] = {"messages": self.conversation(), "max_tokens": self.max_tokens}
        for name in ("temperature", "top_p", "top_k"):
            if (value := getattr(self, name)) is not None:
                payload[name] = value
        if self.stop_sequences:
            payload["stop"] = list(self.stop_sequences)
        if self.prefill:
            payload.update(add_generation_prompt=False, continue_final_message=True)
        return payload


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
    first = error.errors(include_url=False)[0]
    parts = [str(p) for p in first["loc"] if str(p) not in _TYPE_TAGS and not str(p).startswith(("list[", "Messages"))]
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
) -> dict[str, Any]:
    """Anthropic's `Message`. `input_tokens` leaves out what the prefix cache served, which is reported as
    `cache_read_input_tokens` (Anthropic: total input = input + cache creation + cache read)."""
    cached = max(0, min(cached_tokens, prompt_tokens))
    return {
        "id": message_id if message_id.startswith("msg_") else f"msg_{message_id}",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [{"type": "text", "text": text}] if text else [],
        "stop_reason": stop[0],
        "stop_sequence": stop[1],
        "usage": {
            "input_tokens": prompt_tokens - cached,
            "output_tokens": output_tokens,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": cached,
        },
    }


def message_from_chat_completion(completion: dict[str, Any], *, model: str, body: MessagesBody) -> dict[str, Any]:
    """A vLLM server's chat.completion answer to `chat_payload()`, as Anthropic's `Message`."""
    choice = (completion.get("choices") or [{}])[0]
    usage = completion.get("usage") or {}
    output_tokens = int(usage.get("completion_tokens") or 0)
    details = usage.get("prompt_tokens_details") or {}
    stop = anthropic_stop(
        finish_reason=str(choice.get("finish_reason")),
        matched=choice.get("stop_reason"),
        output_tokens=output_tokens,
        max_tokens=body.max_tokens,
    )
    return anthropic_message(
        message_id=str(completion.get("id") or "").removeprefix("chatcmpl-"),
        model=model,
        text=str((choice.get("message") or {}).get("content") or ""),
        stop=stop,
        prompt_tokens=int(usage.get("prompt_tokens") or 0),
        output_tokens=output_tokens,
        cached_tokens=int(details.get("cached_tokens") or 0),
    )
