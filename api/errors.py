"""The one error handler: every failure leaves as OpenAI's envelope (Anthropic's on Anthropic's routes)."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from api.anthropic import errors as anthropic
from storage.errors import BackfillError

log = logging.getLogger(__name__)


def envelope(status: int, message: str, *, type_: str, code: str | None, param: str | None = None) -> JSONResponse:
    """OpenAI's error body: {"error": {"message", "type", "param", "code"}}."""
    body: dict[str, Any] = {"error": {"message": message, "type": type_, "param": param, "code": code}}
    return JSONResponse(body, status_code=status)


def install(app: FastAPI) -> None:
    """Register the handlers on `app`."""

    @app.exception_handler(BackfillError)
    async def _backfill(request: Request, error: BackfillError) -> JSONResponse:
        if anthropic.is_anthropic(request):
            return anthropic.envelope(error.status, error.message)
        return envelope(error.status, error.message, type_=error.type, code=error.code, param=error.param)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, error: RequestValidationError) -> JSONResponse:
        first = error.errors()[0] if error.errors() else {}
        loc = [str(part) for part in first.get("loc", ()) if part not in ("body", "query", "path")]
        param = ".".join(loc) or None
        message = (
            f"Invalid value for '{param}': {first.get('msg', 'invalid request')}." if param else "Invalid request."
        )
        if anthropic.is_anthropic(request):
            return anthropic.envelope(400, message)
        return envelope(400, message, type_="invalid_request_error", code="invalid_request", param=param)

    @app.exception_handler(HTTPException)
    async def _http(request: Request, error: HTTPException) -> JSONResponse:
        if anthropic.is_anthropic(request):
            return anthropic.envelope(error.status_code, str(error.detail))
        code = "not_found" if error.status_code == 404 else None
        return envelope(error.status_code, str(error.detail), type_="invalid_request_error", code=code)

    @app.exception_handler(Exception)
    async def _bug(request: Request, error: Exception) -> JSONResponse:
        log.exception("unhandled error")
        if anthropic.is_anthropic(request):
            return anthropic.envelope(500, "Internal server error.")
        return envelope(500, "The server had an error processing your request.", type_="server_error", code=None)
