"""What OpenAI's answers share: the result of a reply, usage, logprobs in chat and completion shape."""

from __future__ import annotations

from typing import Any

from worker.engine import EngineResult
from worker.engine.generation import Generated, Output, TokenLogprob


def ok(output: Output, answer: dict[str, Any], *, completion: bool = True) -> EngineResult:
    return EngineResult(
        output.request_id,
        200,
        answer,
        prompt_tokens=output.prompt_tokens,
        completion_tokens=completion_tokens(output.sequences) if completion else 0,
        cached_tokens=output.cached_tokens,
        reasoning_tokens=reasoning_tokens(output.sequences),
    )


def completion_tokens(sequences: list[Generated]) -> int:
    return sum(sequence.token_count for sequence in sequences)


def reasoning_tokens(sequences: list[Generated]) -> int:
    """Of the completion tokens, those spent thinking (billed as output, as OpenAI bills them)."""
    return sum(sequence.reasoning_tokens for sequence in sequences)


def usage(output: Output) -> dict[str, Any]:
    completion = completion_tokens(output.sequences)
    return {
        "prompt_tokens": output.prompt_tokens,
        "completion_tokens": completion,
        "total_tokens": output.prompt_tokens + completion,
        "prompt_tokens_details": {"cached_tokens": output.cached_tokens},
        "completion_tokens_details": {"reasoning_tokens": reasoning_tokens(output.sequences)},
    }


def chat_logprobs(tokens: list[TokenLogprob], top: int) -> dict[str, Any]:
    content = [
        {
            "token": item.token,
            "logprob": item.logprob,
            "bytes": list(item.token.encode("utf-8")),
            "top_logprobs": [
                {"token": text, "logprob": value, "bytes": list(text.encode("utf-8"))} for text, value in item.top[:top]
            ],
        }
        for item in tokens
    ]
    return {"content": content, "refusal": None}


def completion_logprobs(tokens: list[TokenLogprob]) -> dict[str, Any]:
    offsets, offset = [], 0
    for item in tokens:
        offsets.append(offset)
        offset += len(item.token)
    return {
        "tokens": [item.token for item in tokens],
        "token_logprobs": [item.logprob for item in tokens],
        "top_logprobs": [dict(item.top) for item in tokens],  # the top k plus the chosen token, as vLLM does
        "text_offset": offsets,
    }
