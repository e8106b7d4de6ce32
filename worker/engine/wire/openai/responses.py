"""OpenAI Responses: a request run as the chat it amounts to, answered as a `response`."""

from __future__ import annotations

import time
import uuid
from typing import Annotated, Any, Literal

from pydantic import Discriminator, Field, Tag, ValidationInfo, field_validator, model_validator

from worker.engine import EngineResult
from worker.engine.generation import Generation, Output
from worker.engine.wire.base import Reply, Strict
from worker.engine.wire.openai import content
from worker.engine.wire.openai import tools as tooling
from worker.engine.wire.openai.answers import chat_logprobs, ok
from worker.engine.wire.openai.chat import ChatBody


class ResponseInputMessage(Strict):
    """One item of a Responses `input` list: a message whose content is text or content items (`input_text`,
    `output_text` passed back, `input_image`, `input_file`: wire/openai/content.py)."""

    type: Literal["message"] | None = None
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[dict[str, Any]]
    id: str | None = None
    status: Literal["in_progress", "completed", "incomplete"] | None = None

    @field_validator("content")
    @classmethod
    def _parts(cls, value: str | list[dict[str, Any]], info: ValidationInfo) -> str | list[dict[str, Any]]:
        if isinstance(value, list):
            return content.responses_parts(value, role=str(info.data.get("role")))
        return value

    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "\n".join(part["text"] for part in self.content if part["type"] == "text")

    def chat_content(self) -> str | list[dict[str, Any]]:
        """The content as a chat message's (neutral parts: ChatBody takes them with `neutral_parts`)."""
        return self.content if isinstance(self.content, str) else content.template_content(self.content)


def _item_type(value: Any) -> str:
    found = value.get("type") if isinstance(value, dict) else getattr(value, "type", None)
    return str(found or "message")


# One item of a Responses `input` list: a message, or a function call / its output / reasoning passed back.
ResponseInputItem = Annotated[
    Annotated[ResponseInputMessage, Tag("message")]
    | Annotated[tooling.FunctionCallItem, Tag("function_call")]
    | Annotated[tooling.FunctionCallOutputItem, Tag("function_call_output")]
    | Annotated[tooling.ReasoningItem, Tag("reasoning")],
    Discriminator(_item_type),
]


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
    # How long GPT-5 models make their answers; other models accept only their own, "medium", as at OpenAI.
    verbosity: Literal["low", "medium", "high"] | None = None

    @field_validator("verbosity")
    @classmethod
    def _medium(cls, value: str | None) -> str | None:
        if value not in (None, "medium"):
            raise ValueError(f"{value!r} is not supported with this model; supported values are: 'medium'")
        return value


# `include` values: what this server returns (logprobs of the output text; reasoning items carry no encrypted
# content to include), and the hosted tools and input echoes the others belong to, which it does not run.
INCLUDES = frozenset({"message.output_text.logprobs", "reasoning.encrypted_content"})
_INCLUDES_REFUSED = {
    "file_search_call.results": "the file_search tool",
    "web_search_call.results": "the web_search tool",
    "web_search_call.action.sources": "the web_search tool",
    "code_interpreter_call.outputs": "the code_interpreter tool",
    "computer_call_output.output.image_url": "computer use",
    "message.input_image.image_url": "echoing input images back",
}


class ResponsesBody(Strict):
    """A Responses API request, run on the chat path: `instructions` lead as a system message."""

    model: str | None = None
    input: str | list[ResponseInputItem]
    instructions: str | None = None
    max_output_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    text: ResponseText | None = None
    metadata: dict[str, str] | None = None
    user: str | None = None
    truncation: Literal["disabled"] | None = None
    include: list[str] | None = Field(default=None, max_length=16)
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    # Every line runs at the batch's priority: any tier is accepted and the answer says "default", as OpenAI's
    # answers name the tier that served them.
    service_tier: Literal["auto", "default", "flex", "scale", "priority", "fast"] | None = None
    prompt_cache_key: str | None = Field(default=None, max_length=1024)  # the prefix cache needs no key
    prompt_cache_retention: Literal["in_memory", "24h"] | None = None  # the prefix cache keeps what fits
    safety_identifier: str | None = Field(default=None, max_length=1024)  # like `user`: accepted, not used
    ignore_eos: bool = False  # vLLM extension
    min_tokens: int = Field(default=0, ge=0)  # vLLM extension
    tools: list[tooling.ResponsesFunctionTool] | None = None
    tool_choice: tooling.ResponsesToolChoice | None = None
    parallel_tool_calls: bool | None = None
    reasoning: tooling.ResponsesReasoning | None = None

    @field_validator("include")
    @classmethod
    def _includable(cls, value: list[str] | None) -> list[str] | None:
        for index, name in enumerate(value or []):
            if name in _INCLUDES_REFUSED:
                raise ValueError(f"{index}: {name!r} needs {_INCLUDES_REFUSED[name]}, which this server does not run")
            if name not in INCLUDES:
                raise ValueError(f"{index}: unknown value {name!r}; supported: {', '.join(sorted(INCLUDES))}")
        return value

    @property
    def wants_logprobs(self) -> bool:
        """The output text's logprobs were asked for (`include`)."""
        return "message.output_text.logprobs" in (self.include or [])

    @field_validator("input")
    @classmethod
    def _not_empty(cls, value: str | list[ResponseInputItem]) -> str | list[ResponseInputItem]:
        if not value:
            raise ValueError("input must not be empty")
        return value

    @field_validator("tools", mode="before")
    @classmethod
    def _function_tools(cls, value: Any) -> Any:
        return tooling.check_tools(value)

    @field_validator("tool_choice", mode="before")
    @classmethod
    def _function_choice(cls, value: Any) -> Any:
        return tooling.check_responses_choice(value)

    def as_chat(self) -> ChatBody:
        """The chat body this request amounts to: what every engine runs."""
        messages: list[dict[str, Any]] = [{"role": "system", "content": self.instructions}] if self.instructions else []
        if isinstance(self.input, str):
            messages.append({"role": "user", "content": self.input})
        else:
            for item in self.input:
                if isinstance(item, ResponseInputMessage):
                    messages.append({"role": item.role, "content": item.chat_content()})
                else:
                    tooling.add_item(messages, item)
        fields: dict[str, Any] = {"messages": messages, "ignore_eos": self.ignore_eos, "min_tokens": self.min_tokens}
        if self.tools is not None:
            fields["tools"] = [tool.chat_form() for tool in self.tools]
        if self.tool_choice is not None:
            fields["tool_choice"] = tooling.chat_choice(self.tool_choice)
        if self.parallel_tool_calls is not None:
            fields["parallel_tool_calls"] = self.parallel_tool_calls
        for name, value in (("max_tokens", self.max_output_tokens), ("temperature", self.temperature)):
            if value is not None:
                fields[name] = value
        if self.top_p is not None:
            fields["top_p"] = self.top_p
        if self.wants_logprobs:
            fields.update(logprobs=True, top_logprobs=self.top_logprobs or 0)
        if (fmt := self.text.format if self.text else None) is not None and fmt.type != "text":
            fields["response_format"] = {"type": fmt.type}
            if fmt.type == "json_schema":
                fields["response_format"]["json_schema"] = {
                    "name": fmt.name,
                    "schema": fmt.schema_,
                    "description": fmt.description,
                    "strict": fmt.strict,
                }
        chat = ChatBody.model_validate(fields, context={"neutral_parts": True})  # parts converted above
        chat._limit_field = "max_output_tokens"
        chat._format_field = "text.format"
        if self.reasoning is not None:
            chat._reasoning = tooling.reasoning_of(self.reasoning.effort, asked=True, param="reasoning.effort")
        return chat

    def generation(self) -> Generation:
        """What an engine runs: the chat request this amounts to."""
        return self.as_chat().generation()


def responses_reply(body: ResponsesBody) -> Reply:
    """A Responses API `response`: its reasoning, an assistant message of output text and its function calls as
    output items; `incomplete` if it hit the cap."""
    fmt = body.text.format if body.text and body.text.format else None
    thinking = body.reasoning
    summary = thinking is not None and (thinking.summary or thinking.generate_summary) is not None
    echoed = {
        "tools": [tool.model_dump(exclude_none=True) for tool in body.tools or []],
        "tool_choice": _echo_choice(body),
        "parallel_tool_calls": body.parallel_tool_calls is not False,
        "reasoning": thinking.model_dump(exclude={"generate_summary"}) if thinking is not None else None,
    }

    def reply(output: Output, model: str) -> EngineResult:
        sequence = output.sequences[0]
        logprobs = None
        if body.wants_logprobs and sequence.logprobs is not None:
            logprobs = chat_logprobs(sequence.logprobs, body.top_logprobs or 0)["content"]
        created = int(time.time())
        complete = sequence.finish_reason != "length"
        answer = {
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
            "output": _with_logprobs(tooling.response_items(sequence, complete=complete, summary=summary), logprobs),
            **echoed,
            "temperature": body.temperature if body.temperature is not None else 1.0,
            "top_p": body.top_p if body.top_p is not None else 1.0,
            "text": {"format": fmt.model_dump(by_alias=True, exclude_none=True) if fmt else {"type": "text"}},
            "truncation": "disabled",
            "metadata": body.metadata or {},
            "user": body.user,
            "store": False,
            "background": False,
            **({"service_tier": "default"} if body.service_tier is not None else {}),
            "top_logprobs": body.top_logprobs,
            "usage": {
                "input_tokens": output.prompt_tokens,
                "input_tokens_details": {"cached_tokens": output.cached_tokens, "cache_write_tokens": 0},
                "output_tokens": sequence.token_count,
                "output_tokens_details": {"reasoning_tokens": sequence.reasoning_tokens},
                "total_tokens": output.prompt_tokens + sequence.token_count,
            },
        }
        return ok(output, answer)

    return reply


def _with_logprobs(items: list[dict[str, Any]], logprobs: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    """The output items, with the text's logprobs on its `output_text` part when `include` asked for them."""
    if logprobs is not None:
        for item in items:
            for part in item.get("content") or [] if item.get("type") == "message" else []:
                if part.get("type") == "output_text":
                    part["logprobs"] = logprobs
    return items


def _echo_choice(body: ResponsesBody) -> Any:
    """The tool choice as the response repeats it (OpenAI's default: `auto` with tools, `none` without)."""
    choice = body.tool_choice
    if choice is None:
        return "auto" if body.tools else "none"
    return choice if isinstance(choice, str) else choice.model_dump()
