"""What the shared-mode HTTP engine (worker/engine/http_engine.py) sends a vLLM server and makes of its answers:
a neutral `Generation` as the request of the server's OpenAI endpoint it amounts to, the server's answer as a
neutral `Output` (the line's wire module answers it, as it answers the in-process engine's), a 4xx as the line's
error, and which answers are worth another attempt (`server_answer`)."""

from __future__ import annotations

from typing import Any

import httpx

from storage.endpoints import CHAT_URL, COMPLETIONS_URL, EMBEDDINGS_URL
from worker.engine import EngineResult
from worker.engine.generation import BodyError, Generated, Generation, Output, TokenLogprob, ToolCall
from worker.engine.tools import random_ids


def server_request(generation: Generation) -> tuple[str, dict[str, Any]]:
    """Where a generation goes on the server and what it says there (vLLM takes top_k, min_tokens, ignore_eos,
    a prefill's continue_final_message and structured outputs as extras). Classification is refused: a vLLM
    server's `/classify` answers each label's probability by index only, without the label names a moderation
    result is made of, and a classifier is small enough to run on an engine of its own."""
    if generation.kind == "classify":
        raise BodyError(
            "moderations do not run on a shared vLLM server: serve the classification model with an engine of its "
            "own (a registry entry without `shared`)",
            code="unsupported_endpoint",
            param="url",
        )
    if generation.kind == "embed":
        payload: dict[str, Any] = {"input": list(generation.inputs), "encoding_format": "float"}
        if generation.dimensions is not None:
            payload["dimensions"] = generation.dimensions
        return EMBEDDINGS_URL, payload
    if generation.kind == "chat":
        url, payload = CHAT_URL, {"messages": list(generation.messages)}
        if generation.continue_final:
            payload.update(add_generation_prompt=False, continue_final_message=True)
    else:
        url, payload = COMPLETIONS_URL, {"prompt": generation.prompt}
    limit = generation.limit.requested or generation.limit.default
    if limit is not None:
        payload["max_tokens"] = limit
    payload.update(_sampling(generation))
    if (constraint := generation.constraint) is not None:
        schema = {"json": constraint.json_schema} if constraint.json_schema is not None else {"json_object": True}
        payload["structured_outputs"] = schema
    payload.update(_tools_and_thinking(generation))
    return url, payload


def _tools_and_thinking(generation: Generation) -> dict[str, Any]:
    """Tools, the tool choice and the thinking switch as vLLM's chat endpoint takes them: the server renders them
    with its template, enforces a forced choice itself and parses calls and thinking with its own parsers."""
    fields: dict[str, Any] = {}
    if generation.tools:
        choice = generation.tool_choice
        fields["tools"] = [tool.template_form() for tool in generation.tools]
        named = {"type": "function", "function": {"name": choice.name}}
        fields["tool_choice"] = named if choice.mode == "named" else choice.mode
        fields["parallel_tool_calls"] = choice.parallel
    if (reasoning := generation.reasoning) is not None:
        fields["chat_template_kwargs"] = {"enable_thinking": reasoning.enabled}
        if reasoning.effort is not None:
            fields["reasoning_effort"] = reasoning.effort
        if reasoning.enabled and reasoning.budget_tokens is not None:
            fields["thinking_token_budget"] = reasoning.budget_tokens
    return fields


def _sampling(generation: Generation) -> dict[str, Any]:
    sampling, fields = generation.sampling, {}
    for name in ("temperature", "top_p", "seed", "presence_penalty", "frequency_penalty"):
        if (value := getattr(sampling, name)) is not None:
            fields[name] = value
    if sampling.n != 1:
        fields["n"] = sampling.n
    if sampling.top_k:
        fields["top_k"] = sampling.top_k
    if sampling.stop:
        fields["stop"] = list(sampling.stop)
    if sampling.min_tokens:
        fields["min_tokens"] = sampling.min_tokens
    if sampling.ignore_eos:
        fields["ignore_eos"] = True
    if sampling.logit_bias:
        fields["logit_bias"] = {str(token): bias for token, bias in sampling.logit_bias.items()}
    if sampling.logprobs is not None:
        chat = generation.kind == "chat"
        fields.update(
            {"logprobs": True, "top_logprobs": sampling.logprobs} if chat else {"logprobs": sampling.logprobs}
        )
    return fields


def output_of(request_id: str, generation: Generation, answer: dict[str, Any], *, cached_tokens: int) -> Output:
    """The server's answer to `server_request(generation)` as a neutral output."""
    usage = answer.get("usage") or {}
    prompt = int(usage.get("prompt_tokens") or 0)
    output = Output(request_id, response_id=_response_id(answer), prompt_tokens=prompt, cached_tokens=cached_tokens)
    if generation.kind == "embed":
        output.vectors = [list(item.get("embedding") or []) for item in answer.get("data") or []]
        return output
    choices = sorted(answer.get("choices") or [], key=lambda choice: int(choice.get("index") or 0))
    counts = _split(int(usage.get("completion_tokens") or 0), len(choices))
    thinking = _split(int((usage.get("completion_tokens_details") or {}).get("reasoning_tokens") or 0), len(choices))
    output.sequences = [
        _calls_and_thinking(
            Generated(
                text=_text(choice, chat=generation.kind == "chat"),
                token_count=count,
                finish_reason=str(choice.get("finish_reason") or "stop"),
                matched=choice.get("stop_reason"),
                logprobs=_logprobs(choice.get("logprobs"), chat=generation.kind == "chat"),
                reasoning_tokens=reasoning_tokens,
            ),
            choice.get("message") or {},
        )
        for choice, count, reasoning_tokens in zip(choices, counts, thinking, strict=True)
    ]
    return output


def _calls_and_thinking(sequence: Generated, message: dict[str, Any]) -> Generated:
    """The tool calls and the thinking the server's parsers took out of a chat answer (vLLM calls the thinking
    `reasoning`, earlier versions `reasoning_content`)."""
    reasoning = message.get("reasoning", message.get("reasoning_content"))
    if isinstance(reasoning, str):
        sequence.reasoning = reasoning
    for call in message.get("tool_calls") or []:
        function = call.get("function") or {}
        call_id = str(call.get("id") or "").removeprefix("call_") or next(random_ids())
        sequence.tool_calls.append(ToolCall(call_id, str(function.get("name")), str(function.get("arguments") or "{}")))
    if sequence.tool_calls and sequence.finish_reason == "stop":  # vLLM answers a named tool's call with "stop"
        sequence.finish_reason = "tool_calls"
    return sequence


def _response_id(answer: dict[str, Any]) -> str:
    found = str(answer.get("id") or "")
    return found.split("-", 1)[1] if "-" in found else found


def _split(total: int, parts: int) -> list[int]:
    """A total count over `parts` sequences (the server counts tokens per request, not per choice)."""
    if parts <= 1:
        return [total] * parts
    share, extra = divmod(total, parts)
    return [share + (1 if index < extra else 0) for index in range(parts)]


def _text(choice: dict[str, Any], *, chat: bool) -> str:
    if chat:
        return str((choice.get("message") or {}).get("content") or "")
    return str(choice.get("text") or "")


def _logprobs(found: Any, *, chat: bool) -> list[TokenLogprob] | None:
    """A server's chat or completion logprobs, back in neutral form."""
    if not isinstance(found, dict):
        return None
    if chat:
        return [
            TokenLogprob(str(item.get("token")), float(item.get("logprob") or 0.0), _ranked(item.get("top_logprobs")))
            for item in found.get("content") or []
        ]
    tokens, values = found.get("tokens") or [], found.get("token_logprobs") or []
    tops = list(found.get("top_logprobs") or []) + [None] * len(tokens)
    return [
        TokenLogprob(str(token), float(value or 0.0), list((top or {}).items()))
        for token, value, top in zip(tokens, values, tops, strict=False)
    ]


def _ranked(tops: Any) -> list[tuple[str, float]]:
    return [(str(top.get("token")), float(top.get("logprob") or 0.0)) for top in tops or []]


def refusal(rid: str, status: int, body: dict[str, Any], *, names: tuple[str, str] | None = None) -> EngineResult:
    """The server refused this one request (4xx): its error body becomes the line's error. `names`: (the server's
    model name, ours): a server started without --served-model-name calls its model by its path, which the line's
    error names by the registry's name instead."""
    found = body.get("error")
    error: dict[str, Any] = found if isinstance(found, dict) else {}
    message = str(error.get("message") or body)
    if names is not None and names[0] and names[0] in message:
        message = message.replace(names[0], names[1])
        body = {**body, "error": {**error, "message": message}}
    code = error.get("code")
    if not isinstance(code, str):  # vLLM puts the HTTP status here; keep OpenAI's string codes stable
        code = "context_length_exceeded" if "context length" in message else "invalid_request"
    return EngineResult(rid, status, body, error_code=code, error_message=message)


RETRY_STATUS = {408, 429}
GOOD_FINISH = {None, "stop", "length", "tool_calls"}


class ServerRetry(Exception):
    """This attempt failed in a way another attempt may not (5xx, dropped connection, aborted sequence)."""


def server_answer(response: httpx.Response) -> dict[str, Any]:
    """The JSON object the server answered (a refusal's too); ServerRetry when another attempt may do better."""
    status = response.status_code
    if status >= 500 or status in RETRY_STATUS:
        raise ServerRetry(f"HTTP {status}: {response.text[:300]}")
    try:
        body = response.json()
    except ValueError:
        raise ServerRetry(f"HTTP {status} with a body that is not JSON: {response.text[:300]}") from None
    if not isinstance(body, dict):
        raise ServerRetry(f"HTTP {status} with a JSON body that is not an object")
    reasons = {choice.get("finish_reason") for choice in body.get("choices", [])} if status < 300 else set()
    if not reasons <= GOOD_FINISH:  # e.g. "abort": the server dropped the sequence; run it again
        raise ServerRetry(f"the server ended the request early ({', '.join(sorted(map(str, reasons)))})")
    return body
