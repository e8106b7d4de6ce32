"""Request limits enforced before a route runs: body size, NUL bytes in the URL, the request thread pool.

FastAPI parses a multipart upload (spooling it to disk) before the route is called, so a limit checked
inside the route comes after the whole body was read. This ASGI middleware refuses a declared
Content-Length over the limit before reading anything, and stops a chunked body as soon as it passes the
limit. Uploads (`POST /v1/files`) may be `upload_max_bytes` plus multipart framing; every other body 1 MiB.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import unquote_to_bytes

import anyio.to_thread
import orjson
from starlette.types import ASGIApp, Message, Receive, Scope, Send

UPLOAD_PATH = "/v1/files"
MULTIPART_SLACK_BYTES = 64 * 1024  # boundaries and part headers around the file
BODY_MAX_BYTES = 1024 * 1024  # JSON bodies (batch creation, estimates): a few kB in practice


class _BodyTooLarge(Exception):
    """Raised into the app when a streamed body passes its limit; the middleware answers 413."""


class RequestLimits:
    """Pure ASGI middleware (no buffering of its own): size limits and URL hygiene for every HTTP request."""

    def __init__(self, app: ASGIApp, *, upload_max_bytes: int, threads: int) -> None:
        self.app = app
        self.upload_max_bytes = upload_max_bytes
        self.threads = threads
        self._threads_set = False

    def _limit(self, scope: Scope) -> int:
        if scope["method"] == "POST" and scope["path"].rstrip("/") == UPLOAD_PATH:
            return self.upload_max_bytes + MULTIPART_SLACK_BYTES
        return BODY_MAX_BYTES

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if not self._threads_set:  # sync routes run on AnyIO's pool; the DB pool is sized to match it
            anyio.to_thread.current_default_thread_limiter().total_tokens = self.threads
            self._threads_set = True
        if (
            b"\x00" in scope.get("raw_path", b"") + unquote_to_bytes(scope.get("query_string", b""))
            or "\x00" in (scope["path"])
        ):
            await _answer(send, 400, "The URL contains a NUL character.", code="invalid_request")
            return
        limit = self._limit(scope)
        declared = _content_length(scope)
        if declared is not None and declared > limit:
            await _too_large(send, scope, limit)
            return
        await self._streamed(scope, receive, send, limit)

    async def _streamed(self, scope: Scope, receive: Receive, send: Send, limit: int) -> None:
        received = 0
        exceeded = False
        started = False

        async def limited_receive() -> Message:
            nonlocal received, exceeded
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    exceeded = True
                    raise _BodyTooLarge
            return message

        async def guarded_send(message: Message) -> None:
            nonlocal started
            if exceeded and not started:
                return  # the app's own answer to the cut-off body (a parse error) is replaced by the 413
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, limited_receive, guarded_send)
        except Exception:
            if not exceeded:
                raise
        if exceeded and not started:
            await _too_large(send, scope, limit)


def _content_length(scope: Scope) -> int | None:
    for name, value in scope["headers"]:
        if name == b"content-length":
            return int(value) if value.isdigit() else None
    return None


async def _too_large(send: Send, scope: Scope, limit: int) -> None:
    upload = scope["path"].rstrip("/") == UPLOAD_PATH
    what = "File" if upload else "Request body"
    size = limit - MULTIPART_SLACK_BYTES if upload else limit
    await _answer(
        send,
        413,
        f"{what} is larger than the {size} byte limit.",
        code="file_too_large",
        param="file" if upload else None,
    )


async def _answer(send: Send, status: int, message: str, *, code: str, param: str | None = None) -> None:
    """OpenAI's envelope (api/errors.py's shape), closing the connection: the rest of the body is never read."""
    body = orjson.dumps({"error": {"message": message, "type": "invalid_request_error", "param": param, "code": code}})
    headers: list[tuple[bytes, bytes]] = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"connection", b"close"),
    ]
    start: dict[str, Any] = {"type": "http.response.start", "status": status, "headers": headers}
    await send(start)
    await send({"type": "http.response.body", "body": body})


def install(app: Any) -> None:
    """Add the limits to `app` with this deployment's upload limit and request threads."""
    from storage.settings import get_settings

    settings = get_settings()
    app.add_middleware(RequestLimits, upload_max_bytes=settings.upload_max_bytes, threads=settings.api_threads)
