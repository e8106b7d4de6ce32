"""OpenAI response bodies out: an engine's neutral `Output` as the answer of the endpoint the line came in on.

Chat completions, text completions, Responses (run as chat, answered as a `response`) and embeddings. Every
engine's outputs go through here, so they agree exactly.
"""

from __future__ import annotations

import base64
import sys
import time
import uuid
from array import array
from typing import Any

from worker.engine import EngineResult
from worker.engine.generation import Generated, Output, TokenLogprob
from worker.engine.wire.base import Reply
from worker.engine.wire.openai import ChatBody, CompletionBody, EmbeddingBody, ResponsesBody


def chat_reply(body: ChatBody) -> Reply:
    """A `chat.completion`, with chat-shaped logprobs (the top `top_logprobs` alternatives) if asked."""
    top = body.top_logprobs or 0

    def reply(output: Output, model: str) -> EngineResult:
        choices = [
            {
                "index": index,
                "message": {"role": "assistant", "content": sequence.text},
                "logprobs": _chat_logprobs(sequence.logprobs, top) if sequence.logprobs is not None else None,
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
            "usage": _usage(output),
        }
        return _ok(output, answer)

    return reply


def completion_reply(body: CompletionBody) -> Reply:
    """A `text_completion`, with completion-shaped logprobs if asked."""

    def reply(output: Output, model: str) -> EngineResult:
        choices = [
            {
                "index": index,
                "text": sequence.text,
                "logprobs": _completion_logprobs(sequence.logprobs) if sequence.logprobs is not None else None,
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
            "usage": _usage(output),
        }
        return _ok(output, answer)

    return reply


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
        return _ok(output, answer)

    return reply


def embedding_reply(body: EmbeddingBody) -> Reply:
    """An embeddings `list`; base64 is little-endian float32, as OpenAI's client expects."""

    def reply(output: Output, model: str) -> EngineResult:
        answer = {
            "object": "list",
            "data": [
                {"object": "embedding", "index": index, "embedding": _encode(vector, body.encoding_format)}
                for index, vector in enumerate(output.vectors)
            ],
            "model": model,
            "usage": {"prompt_tokens": output.prompt_tokens, "total_tokens": output.prompt_tokens},
        }
        return _ok(output, answer, completion=False)

    return reply


def _ok(output: Output, answer: dict[str, Any], *, completion: bool = True) -> EngineResult:
    return EngineResult(
        output.request_id,
        200,
        answer,
        prompt_tokens=output.prompt_tokens,
        completion_tokens=_completion_tokens(output.sequences) if completion else 0,
        cached_tokens=output.cached_tokens,
    )


def _completion_tokens(sequences: list[Generated]) -> int:
    return sum(sequence.token_count for sequence in sequences)


def _usage(output: Output) -> dict[str, Any]:
    completion = _completion_tokens(output.sequences)
    return {
        "prompt_tokens": output.prompt_tokens,
        "completion_tokens": completion,
        "total_tokens": output.prompt_tokens + completion,
        "prompt_tokens_details": {"cached_tokens": output.cached_tokens},
    }


def _chat_logprobs(tokens: list[TokenLogprob], top: int) -> dict[str, Any]:
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


def _completion_logprobs(tokens: list[TokenLogprob]) -> dict[str, Any]:
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


def _encode(vector: list[float], encoding_format: str) -> list[float] | str:
    if encoding_format == "float":
        return vector
    packed = array("f", vector)
    if sys.byteorder == "big":
        packed.byteswap()
    return base64.b64encode(packed.tobytes()).decode("ascii")
