"""OpenAI response bodies out: what every Engine returns for a finished OpenAI request, so they agree exactly."""

from __future__ import annotations

import base64
import sys
import time
import uuid
from array import array
from dataclasses import dataclass
from typing import Any

from worker.engine.wire.base import BodyError
from worker.engine.wire.openai import Body, ChatBody, CompletionBody, EmbeddingBody, ResponsesBody


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


def response_from_chat(
    request: ResponsesBody, chat: dict[str, Any], *, model: str, cached_tokens: int
) -> dict[str, Any]:
    """A server's chat.completion answer to a Responses request (run as chat), as a `response` object."""
    first = (chat.get("choices") or [{}])[0]
    usage = chat.get("usage") or {}
    choice = Choice(
        text=str((first.get("message") or {}).get("content") or ""),
        finish_reason=str(first.get("finish_reason") or "stop"),
        token_count=int(usage.get("completion_tokens") or 0),
    )
    prompt = int(usage.get("prompt_tokens") or 0)
    return response_object(body=request, model=model, choice=choice, prompt_tokens=prompt, cached_tokens=cached_tokens)


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
