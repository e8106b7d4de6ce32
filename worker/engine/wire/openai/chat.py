"""OpenAI chat completions: the request's messages and fields in, a `chat.completion` out."""

from __future__ import annotations

import time
import uuid
from typing import Any, Literal

from pydantic import Field, PrivateAttr, ValidationInfo, field_validator, model_validator

from worker.engine import EngineResult
from worker.engine.generation import Generation, Output, OutputLimit, Reasoning, Tool, ToolChoice
from worker.engine.wire.base import Reply, Strict
from worker.engine.wire.openai import content
from worker.engine.wire.openai import tools as tooling
from worker.engine.wire.openai.answers import chat_logprobs, ok, usage
from worker.engine.wire.openai.sampling import SamplingBody


class ChatMessage(Strict):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None
    tool_calls: list[tooling.ChatToolCall] | None = None  # assistant: the calls it made (wire/openai/tools.py)
    tool_call_id: str | None = None  # tool: the call this message answers
    refusal: str | None = None  # assistant: a refusal passed back (not rendered)

    @model_validator(mode="after")
    def _tool_fields(self) -> ChatMessage:
        tooling.check_message(self.role, self.content, self.tool_calls, self.tool_call_id)
        return self

    @field_validator("content")
    @classmethod
    def _parts(cls, value: str | list[dict[str, Any]] | None, info: ValidationInfo) -> Any:
        """Content parts as neutral parts (wire/openai/content.py): text, images, PDF files."""
        if isinstance(value, list):
            neutral = bool(info.context and info.context.get("neutral_parts"))  # a Responses body's, converted
            return content.chat_parts(value, role=str(info.data.get("role")), neutral=neutral)
        return value

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "\n".join(part["text"] for part in self.content if part["type"] == "text")

    def template_content(self) -> str | list[dict[str, Any]]:
        """The content as the engine takes it: a string, or the parts when an image or a document is among them."""
        if isinstance(self.content, list):
            return content.template_content(self.content)
        return self.content or ""

    def template_form(self) -> dict[str, Any]:
        """The message as vLLM's renderer takes it: role and text, and its tool calls or the call it answers."""
        return tooling.template_message(
            {"role": self.role, "content": self.template_content()}, self.tool_calls, self.tool_call_id
        )


class ChatBody(SamplingBody):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    tools: list[tooling.ChatTool] | None = None
    tool_choice: tooling.ChatToolChoice | None = None
    parallel_tool_calls: bool | None = None
    reasoning_effort: tooling.Effort | None = None
    thinking_token_budget: int | None = Field(default=None, ge=0)  # vLLM extension: a hard limit on thinking
    # Every line runs at the batch's priority: any tier is accepted and the answer says "default", as OpenAI's
    # answers name the tier that served them.
    service_tier: Literal["auto", "default", "flex", "scale", "priority", "fast"] | None = None
    prompt_cache_key: str | None = Field(default=None, max_length=1024)  # the prefix cache needs no key
    prompt_cache_retention: Literal["in_memory", "24h"] | None = None  # the prefix cache keeps what fits
    safety_identifier: str | None = Field(default=None, max_length=1024)  # like `user`: accepted, not used
    metadata: dict[str, str] | None = Field(default=None, max_length=16)  # OpenAI keeps it with stored completions
    modalities: list[Literal["text"]] | None = Field(default=None, max_length=1)  # text out only: no audio model
    verbosity: Literal["medium"] | None = None  # GPT-5's length hint; other models take only their own, as OpenAI
    _limit_field: str | None = PrivateAttr(default=None)  # set when a Responses body runs as this chat body
    _reasoning: Reasoning | None = PrivateAttr(default=None)  # set when a Responses body asks for reasoning

    @field_validator("tools", mode="before")
    @classmethod
    def _function_tools(cls, value: Any) -> Any:
        return tooling.check_tools(value)

    def output_limit(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    def requested_output(self) -> tuple[int, str] | None:
        limit = self.output_limit()
        if limit is None:
            return None
        name = self._limit_field or ("max_completion_tokens" if self.max_completion_tokens else "max_tokens")
        return limit, name

    def conversation(self) -> list[dict[str, Any]]:
        """Messages flattened to role + text, the shape every chat template understands (with the tool calls an
        assistant message made and the call a tool message answers)."""
        return [m.template_form() for m in self.messages]

    def logprob_count(self) -> int | None:
        """How many logprobs per token the engine must return (None: none)."""
        return (self.top_logprobs or 0) if self.logprobs else None

    def tool_setup(self) -> tuple[tuple[Tool, ...], ToolChoice]:
        """The tools the model may call and the tool choice, in neutral terms."""
        declared = [tool.function.tool() for tool in self.tools or []]
        return tooling.tool_choice(self.tool_choice, declared, parallel=self.parallel_tool_calls)

    def generation(self) -> Generation:
        """What an engine runs for this chat request."""
        requested = self.requested_output()
        chosen, choice = self.tool_setup()
        reasoning = self._reasoning or tooling.reasoning_of(self.reasoning_effort, budget=self.thinking_token_budget)
        return Generation(
            kind="chat",
            messages=tuple(self.conversation()),
            limit=OutputLimit(requested=requested[0], name=requested[1]) if requested else OutputLimit(),
            sampling=self.sampling(),
            constraint=self.constraint(),
            tools=chosen,
            tool_choice=choice,
            reasoning=reasoning,
        )


def chat_reply(body: ChatBody) -> Reply:
    """A `chat.completion`, with chat-shaped logprobs (the top `top_logprobs` alternatives) if asked."""
    top = body.top_logprobs or 0
    _, choice = body.tool_setup()

    def reply(output: Output, model: str) -> EngineResult:
        choices = [
            {
                "index": index,
                "message": tooling.answer_message(sequence),
                "logprobs": chat_logprobs(sequence.logprobs, top) if sequence.logprobs is not None else None,
                "finish_reason": tooling.finish_reason(sequence, choice),
            }
            for index, sequence in enumerate(output.sequences)
        ]
        answer = {
            "id": f"chatcmpl-{output.response_id or uuid.uuid4().hex}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": model,
            "choices": choices,
            "usage": usage(output),
            **({"service_tier": "default"} if body.service_tier is not None else {}),
        }
        return ok(output, answer)

    return reply
