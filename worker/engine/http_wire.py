"""What the shared-mode HTTP engine (worker/engine/http_engine.py) sends a server and what it makes of a refusal:
a batch line's body checked as the in-process engine checks it, the request it becomes on the wire, and a 4xx
answer as the line's error."""

from __future__ import annotations

from typing import Any

from storage.protocols import CHAT_URL
from worker.engine import EngineResult
from worker.engine.wire import parse_body
from worker.engine.wire.anthropic import MessagesBody
from worker.engine.wire.openai import Body, CompletionBody, EmbeddingBody, ResponsesBody


def validate_body(url: str, body: Any) -> Body | MessagesBody:
    """The same strict checks as the in-process engine, so a line fails the same way in both modes."""
    parsed = parse_body(url, body)
    if isinstance(parsed, CompletionBody):
        parsed.single_prompt()
    elif isinstance(parsed, EmbeddingBody):
        parsed.inputs()
    return parsed


def wire_request(url: str, body: dict[str, Any], parsed: Body) -> tuple[str, dict[str, Any]]:
    """Where a request goes and what it says: a Responses request runs as the chat request it amounts to."""
    if isinstance(parsed, ResponsesBody):
        return CHAT_URL, parsed.as_chat().model_dump(by_alias=True, exclude_none=True, exclude_defaults=True)
    return url, body


def refusal(rid: str, status: int, body: dict[str, Any]) -> EngineResult:
    """The server refused this one request (4xx): its error body becomes the line's error."""
    found = body.get("error")
    error: dict[str, Any] = found if isinstance(found, dict) else {}
    message = str(error.get("message") or body)
    code = error.get("code")
    if not isinstance(code, str):  # vLLM puts the HTTP status here; keep OpenAI's string codes stable
        code = "context_length_exceeded" if "context length" in message else "invalid_request"
    return EngineResult(rid, status, body, error_code=code, error_message=message)
