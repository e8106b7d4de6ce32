"""vLLM's completion outputs as answers: OpenAI choices (text, stop reason, logprobs) and Anthropic messages.

Token texts come from vLLM's `decoded_token` when it has one, else from the model's tokenizer.
"""

from __future__ import annotations

import uuid
from typing import Any

from worker.engine import EngineResult
from worker.engine.wire.anthropic import MessagesBody, anthropic_message, anthropic_stop
from worker.engine.wire.openai import ChatBody, CompletionBody
from worker.engine.wire.openai_results import Choice

# Logprobs can be -inf, which JSON cannot carry; vLLM's server clamps the same way.
_MIN_LOGPROB = -9999.0


def choice_of(completion: Any, body: ChatBody | CompletionBody, tokenizer: Any) -> Choice:
    """One vLLM completion output as an engine-neutral `Choice`, with OpenAI-shaped logprobs if asked."""
    logprobs = None
    if completion.logprobs is not None and body.logprob_count() is not None:
        if isinstance(body, ChatBody):
            logprobs = _chat_logprobs(completion, body.top_logprobs or 0, tokenizer)
        else:
            logprobs = _completion_logprobs(completion, tokenizer)
    return Choice(
        text=completion.text,
        finish_reason=str(completion.finish_reason),
        token_count=len(completion.token_ids),
        logprobs=logprobs,
    )


def _token_text(token_id: int, logprob: Any, tokenizer: Any) -> str:
    text = getattr(logprob, "decoded_token", None)
    return text if text is not None else str(tokenizer.decode([token_id]))


def _ranked(position: dict[int, Any], tokenizer: Any) -> list[tuple[str, float]]:
    ranked = sorted(position.items(), key=lambda item: -item[1].logprob)
    return [(_token_text(tid, lp, tokenizer), max(lp.logprob, _MIN_LOGPROB)) for tid, lp in ranked]


def _chat_logprobs(completion: Any, top: int, tokenizer: Any) -> dict[str, Any]:
    content = []
    for token_id, position in zip(completion.token_ids, completion.logprobs, strict=False):
        chosen = position[token_id]
        token = _token_text(token_id, chosen, tokenizer)
        content.append(
            {
                "token": token,
                "logprob": max(chosen.logprob, _MIN_LOGPROB),
                "bytes": list(token.encode("utf-8")),
                "top_logprobs": [
                    {"token": text, "logprob": value, "bytes": list(text.encode("utf-8"))}
                    for text, value in _ranked(position, tokenizer)[:top]
                ],
            }
        )
    return {"content": content, "refusal": None}


def _completion_logprobs(completion: Any, tokenizer: Any) -> dict[str, Any]:
    tokens: list[str] = []
    token_logprobs: list[float] = []
    top_logprobs: list[dict[str, float]] = []
    offsets: list[int] = []
    offset = 0
    for token_id, position in zip(completion.token_ids, completion.logprobs, strict=False):
        chosen = position[token_id]
        token = _token_text(token_id, chosen, tokenizer)
        tokens.append(token)
        token_logprobs.append(max(chosen.logprob, _MIN_LOGPROB))
        top_logprobs.append(dict(_ranked(position, tokenizer)))  # top k plus the chosen token, as vLLM does
        offsets.append(offset)
        offset += len(token)
    return {
        "tokens": tokens,
        "token_logprobs": token_logprobs,
        "top_logprobs": top_logprobs,
        "text_offset": offsets,
    }


def message_of(
    rid: str, body: MessagesBody, completion: Any, model: str, *, prompt_tokens: int, cached: int
) -> EngineResult:
    """Anthropic's Message; vLLM's `stop_reason` names the stop string that matched, if one did."""
    output_tokens = len(completion.token_ids)
    stop = anthropic_stop(
        finish_reason=str(completion.finish_reason),
        matched=completion.stop_reason,
        output_tokens=output_tokens,
        max_tokens=body.max_tokens,
    )
    message = anthropic_message(
        message_id=uuid.uuid4().hex[:24],
        model=model,
        text=completion.text,
        stop=stop,
        prompt_tokens=prompt_tokens,
        output_tokens=output_tokens,
        cached_tokens=cached,
    )
    return EngineResult(
        rid, 200, message, prompt_tokens=prompt_tokens, completion_tokens=output_tokens, cached_tokens=cached
    )
