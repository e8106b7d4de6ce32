"""OpenAI Responses: a request run as the chat it amounts to, answered as a `response`."""

from __future__ import annotations

import time
import uuid
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from worker.engine import EngineResult
from worker.engine.generation import Generation, Output
from worker.engine.wire.base import Reply, Strict
from worker.engine.wire.openai.answers import ok
from worker.engine.wire.openai.chat import ChatBody


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


def responses_reply(body: ResponsesBody) -> Reply:
    """A Responses API `response`: one assistant message of output text; `incomplete` if it hit the cap."""
    fmt = body.text.format if body.text and body.text.format else None

    def reply(output: Output, model: str) -> EngineResult:
        sequence = output.sequences[0]
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
            "output": [
                {
                    "type": "message",
                    "id": f"msg_{uuid.uuid4().hex}",
                    "status": "completed" if complete else "incomplete",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": sequence.text, "annotations": [], "logprobs": []}],
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
                "input_tokens": output.prompt_tokens,
                "input_tokens_details": {"cached_tokens": output.cached_tokens, "cache_write_tokens": 0},
                "output_tokens": sequence.token_count,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": output.prompt_tokens + sequence.token_count,
            },
        }
        return ok(output, answer)

    return reply
