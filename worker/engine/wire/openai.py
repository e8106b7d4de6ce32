"""OpenAI request bodies in, OpenAI response bodies out: shared by every Engine so they agree exactly.

Chat completions, completions, embeddings and responses (run as the chat request it amounts to).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, PrivateAttr, ValidationError, field_validator, model_validator

from storage.protocols import CHAT_URL, COMPLETIONS_URL, EMBEDDINGS_URL, RESPONSES_URL
from worker.engine.generation import Constraint, Generation, OutputLimit, Sampling
from worker.engine.wire.base import TYPE_TAGS, BodyError, Strict

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


class ChatMessage(Strict):
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


class JsonSchemaFormat(Strict):
    name: str
    schema_: dict[str, Any] = Field(default_factory=dict, alias="schema")
    description: str | None = None
    strict: bool | None = None


class ResponseFormat(Strict):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class _SamplingBody(Strict):
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

    def logprob_count(self) -> int | None:
        """How many logprobs per token the engine must return (None: none)."""
        return None

    def sampling(self) -> Sampling:
        """How to sample, in the engine's neutral terms."""
        bias = None
        if self.logit_bias:
            try:
                bias = {int(token): value for token, value in self.logit_bias.items()}
            except ValueError:
                raise BodyError(
                    "logit_bias keys must be token ids (integers)", code="invalid_value", param="logit_bias"
                ) from None
        return Sampling(
            n=self.n,
            temperature=self.temperature,
            top_p=self.top_p,
            seed=self.seed,
            presence_penalty=self.presence_penalty,
            frequency_penalty=self.frequency_penalty,
            logit_bias=bias,
            min_tokens=self.min_tokens,
            ignore_eos=self.ignore_eos,
            stop=tuple(self.stop_list()),
            logprobs=self.logprob_count(),
        )

    def constraint(self) -> Constraint | None:
        """The answer's required shape (`response_format`), if any."""
        fmt = self.response_format
        if fmt is None or fmt.type == "text":
            return None
        if fmt.type == "json_schema" and fmt.json_schema is not None:
            return Constraint(json_schema=fmt.json_schema.schema_)
        return Constraint(json_object=True)


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

    def generation(self) -> Generation:
        """What an engine runs for this chat request."""
        requested = self.requested_output()
        return Generation(
            kind="chat",
            messages=tuple(self.conversation()),
            limit=OutputLimit(requested=requested[0], name=requested[1]) if requested else OutputLimit(),
            sampling=self.sampling(),
            constraint=self.constraint(),
        )


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

    def generation(self) -> Generation:
        """What an engine runs for this completion request: one prompt, 16 tokens unless asked (OpenAI's)."""
        return Generation(
            kind="text",
            prompt=self.single_prompt(),
            limit=OutputLimit(requested=self.max_tokens, name="max_tokens", default=16),
            sampling=self.sampling(),
            constraint=self.constraint(),
        )


class EmbeddingBody(Strict):
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

    def generation(self) -> Generation:
        """One vector per input."""
        return Generation(kind="embed", inputs=tuple(self.inputs()), dimensions=self.dimensions)


class _InputPart(Strict):
    """A text part of a Responses input message (`output_text` when earlier assistant output is passed back)."""

    type: Literal["input_text", "output_text"]
    text: str
    annotations: list[Any] | None = None
    logprobs: list[Any] | None = None


class ResponseInputMessage(Strict):
    """One item of a Responses `input` list: a message with text content (images, files and tools are not run)."""

    type: Literal["message"] | None = None
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[_InputPart]
    id: str | None = None
    status: Literal["in_progress", "completed", "incomplete"] | None = None

    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "\n".join(part.text for part in self.content)


class ResponseTextFormat(Strict):
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


class ResponseText(Strict):
    format: ResponseTextFormat | None = None


class ResponsesBody(Strict):
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

    def generation(self) -> Generation:
        """What an engine runs: the chat request this amounts to."""
        return self.as_chat().generation()


Body = ChatBody | CompletionBody | EmbeddingBody | ResponsesBody
_BODY_TYPES: dict[str, type[Body]] = {
    CHAT_URL: ChatBody,
    COMPLETIONS_URL: CompletionBody,
    EMBEDDINGS_URL: EmbeddingBody,
    RESPONSES_URL: ResponsesBody,
}


def parse_openai_body(url: str, body: Any) -> Body:
    """Validate an OpenAI request body for `url`; raise BodyError with an OpenAI-style message."""
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


def _describe(error: ValidationError) -> BodyError:
    first = error.errors(include_url=False)[0]
    # Union members add their type name to `loc` ("prompt.str"); the user wants the field path.
    where = ".".join(str(part) for part in first["loc"] if str(part) not in TYPE_TAGS and "[" not in str(part))
    param = str(first["loc"][0]) if first["loc"] else None
    if first["type"] == "extra_forbidden":
        return BodyError(f"unsupported parameter {where!r}", code="unsupported_parameter", param=param)
    if first["type"] == "missing":
        return BodyError(f"missing required parameter {where!r}", code="missing_required_parameter", param=param)
    return BodyError(f"invalid value for {where!r}: {first['msg']}", code="invalid_value", param=param)
