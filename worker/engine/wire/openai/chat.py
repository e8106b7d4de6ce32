"""OpenAI chat completions: the request's messages and fields in, a `chat.completion` out."""

from __future__ import annotations

import time
import uuid
from typing import Any, Literal

from pydantic import Field, PrivateAttr, field_validator

from worker.engine import EngineResult
from worker.engine.generation import Generation, Output, OutputLimit
from worker.engine.wire.base import Reply, Strict
from worker.engine.wire.openai.answers import chat_logprobs, ok, usage
from worker.engine.wire.openai.sampling import SamplingBody


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


class ChatBody(SamplingBody):
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


def chat_reply(body: ChatBody) -> Reply:
    """A `chat.completion`, with chat-shaped logprobs (the top `top_logprobs` alternatives) if asked."""
    top = body.top_logprobs or 0

    def reply(output: Output, model: str) -> EngineResult:
        choices = [
            {
                "index": index,
                "message": {"role": "assistant", "content": sequence.text},
                "logprobs": chat_logprobs(sequence.logprobs, top) if sequence.logprobs is not None else None,
                "finish_reason": sequence.finish_reason,
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
        }
        return ok(output, answer)

    return reply
