"""OpenAI's error envelope: {"error": {"message", "type", "param", "code"}}, on every path no other protocol
claims (api/dialects.py)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fastapi.responses import JSONResponse
from pydantic import BaseModel


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorResponse(BaseModel):
    """OpenAI's error envelope, the body of every 4xx and 5xx."""

    error: ErrorDetail


def envelope(
    status: int,
    message: str,
    *,
    type_: str,
    code: str | None,
    param: str | None = None,
    headers: Mapping[str, str] | None = None,
) -> JSONResponse:
    """OpenAI's error body: {"error": {"message", "type", "param", "code"}}."""
    body: dict[str, Any] = {"error": {"message": message, "type": type_, "param": param, "code": code}}
    return JSONResponse(body, status_code=status, headers=headers)
