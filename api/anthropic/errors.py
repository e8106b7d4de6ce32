"""Anthropic's error envelope for its routes: {"type": "error", "error": {"type", "message"}}.

The status decides the type, as Anthropic documents them: 400 invalid_request_error, 401
authentication_error, 403 permission_error, 404 not_found_error, 413 request_too_large, 429
rate_limit_error, 500 api_error. An illegal state change (cancelling an ended batch, deleting a running
one) is a 400 here, as Anthropic answers it, where the OpenAI routes say 409.
"""

from __future__ import annotations

from typing import Literal

from fastapi.responses import JSONResponse
from pydantic import BaseModel

from storage.lines.anthropic import error_type

PREFIX = "/v1/messages"  # its paths: this one and those under it (api/dialects.py)


class AnthropicErrorDetail(BaseModel):
    type: str
    message: str


class AnthropicErrorResponse(BaseModel):
    """Anthropic's error envelope, the body of every 4xx and 5xx on its routes."""

    type: Literal["error"] = "error"
    error: AnthropicErrorDetail


def envelope(status: int, message: str, *, headers: dict[str, str] | None = None) -> JSONResponse:
    """Anthropic's error body with the status that matches its type (and the error's headers, e.g. `Allow`)."""
    if status in (409, 422):
        status = 400
    kind = "request_too_large" if status == 413 else error_type(status)
    body = {"type": "error", "error": {"type": kind, "message": message}}
    return JSONResponse(body, status_code=status, headers=headers)
