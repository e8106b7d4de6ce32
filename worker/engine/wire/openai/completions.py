"""OpenAI (legacy) completions: one prompt in, a `text_completion` out."""

from __future__ import annotations

import time
import uuid

from pydantic import Field

from worker.engine import EngineResult
from worker.engine.generation import Generation, Output, OutputLimit
from worker.engine.wire.base import BodyError, Reply
from worker.engine.wire.openai.answers import completion_logprobs, ok, usage
from worker.engine.wire.openai.sampling import SamplingBody


class CompletionBody(SamplingBody):
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


def completion_reply(body: CompletionBody) -> Reply:
    """A `text_completion`, with completion-shaped logprobs if asked."""

    def reply(output: Output, model: str) -> EngineResult:
        choices = [
            {
                "index": index,
                "text": sequence.text,
                "logprobs": completion_logprobs(sequence.logprobs) if sequence.logprobs is not None else None,
                "finish_reason": sequence.finish_reason,
            }
            for index, sequence in enumerate(output.sequences)
        ]
        answer = {
            "id": f"cmpl-{output.response_id or uuid.uuid4().hex}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": model,
            "choices": choices,
            "usage": usage(output),
        }
        return ok(output, answer)

    return reply
