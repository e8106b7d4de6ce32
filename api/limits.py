"""Request limits enforced before a route runs: body size and shape, NUL bytes in the URL, the request pool and
each tenant's share of it (api/fair_share.py).

A limit checked inside a route comes after the route was called, and a body FastAPI parses (a form, JSON)
is read whole before that. This ASGI middleware refuses a declared
Content-Length over the limit before reading anything, and stops a chunked body as soon as it passes the
limit. Three kinds of body, one rule each:
- uploads (`POST /v1/files`): `upload_max_bytes` plus multipart framing, streamed into the route, which
  reads the form as it arrives (api/multipart.py); the file's lines are judged by the one line checker at
  ingest; an Uploads part (`POST /v1/uploads/{id}/parts`): `upload_part_max_bytes` plus framing, the same way;
- a create whose requests are inline (each protocol's `streamed_create`, storage/protocols.py) and its estimate
  (`streamed_estimate`): its own limit, streamed into the route, which splits it with the one bounded reader
  (storage/lines/bounded_json.py) and judges each request;
- every other body: at most 1 MiB, read here whole, then walked for depth and parsed strictly by the same
  bounded reader (off the event loop) before the app sees it: a 400 in the path's envelope, never a 500.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import unquote_to_bytes

import anyio.to_thread
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.dialects import dialect_of
from api.fair_share import TenantShare
from storage.errors import InvalidRequest, RequestTooLarge
from storage.lines.bounded_json import check_body

UPLOAD_PATH = "/v1/files"
UPLOAD_PART_PATH = re.compile(r"/v1/uploads/[^/]+/parts")  # an Uploads part (fullmatch)
MULTIPART_SLACK_BYTES = 64 * 1024  # boundaries and part headers around the file
BODY_MAX_BYTES = 1024 * 1024  # JSON bodies (batch creation, estimates): a few kB in practice


class _BodyTooLarge(RequestTooLarge):
    """Raised into the app when a streamed body passes its limit; the middleware answers 413 (a typed error, so
    a route reading the stream renders it like any other instead of logging an unhandled exception)."""


class RequestLimits:
    """Pure ASGI middleware (no buffering of its own): size limits and URL hygiene for every HTTP request."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        upload_max_bytes: int,
        threads: int,
        upload_part_max_bytes: int = 64 * 1024 * 1024,
        streamed_creates: Mapping[str, int] | None = None,
    ) -> None:
        self.app = app
        self.upload_max_bytes = upload_max_bytes
        self.upload_part_max_bytes = upload_part_max_bytes
        self.streamed_creates = dict(streamed_creates or {})  # {path: body limit} of creates with inline requests
        self.threads = threads
        self._threads_set = False

    def _streamed_limit(self, scope: Scope) -> int | None:
        """The limit of a body the route streams itself, or None for a small body checked here."""
        if scope["method"] != "POST":
            return None
        path = scope["path"].rstrip("/")
        if path == UPLOAD_PATH:
            return self.upload_max_bytes + MULTIPART_SLACK_BYTES
        if path in self.streamed_creates:
            return self.streamed_creates[path]
        if UPLOAD_PART_PATH.fullmatch(path):
            return self.upload_part_max_bytes + MULTIPART_SLACK_BYTES
        return None

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
            await _answer(send, scope, 400, "The URL contains a NUL character.", code="invalid_request")
            return
        streamed = self._streamed_limit(scope)
        limit = BODY_MAX_BYTES if streamed is None else streamed
        declared = _content_length(scope)
        if declared is not None and declared > limit:
            await _too_large(send, scope, limit)
            return
        if streamed is None:
            await self._checked(scope, receive, send)
        else:
            await self._streamed(scope, receive, send, limit)

    async def _checked(self, scope: Scope, receive: Receive, send: Send) -> None:
        """A small body, read whole (at most 1 MiB), judged by the bounded reader, then replayed to the app."""
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client went away
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > BODY_MAX_BYTES:
                await _too_large(send, scope, BODY_MAX_BYTES)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        if body.strip():
            try:  # off the event loop: walking and parsing 1 MiB must not hold /health
                await anyio.to_thread.run_sync(check_body, [body])
            except InvalidRequest as error:
                await _answer(send, scope, 400, error.message, code=error.code)
                return
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay, send)

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
                    raise _BodyTooLarge("The request body passed its size limit.")
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
    path = scope["path"].rstrip("/")
    if path == UPLOAD_PATH:
        what, code, param, size = "File", "file_too_large", "file", limit - MULTIPART_SLACK_BYTES
    elif UPLOAD_PART_PATH.fullmatch(path):
        what, code, param, size = "The part", "part_too_large", "data", limit - MULTIPART_SLACK_BYTES
    else:
        what, code, param, size = "Request body", "request_too_large", None, limit
    await _answer(send, scope, 413, f"{what} is larger than the {size} byte limit.", code=code, param=param)


async def _answer(send: Send, scope: Scope, status: int, message: str, *, code: str, param: str | None = None) -> None:
    """The path's envelope (api/dialects.py), closing the connection: the rest of the body is never read."""
    envelope = dialect_of(scope["path"]).envelope
    response = envelope(
        status, message, type_="invalid_request_error", code=code, param=param, headers={"Connection": "close"}
    )
    await response(scope, _no_body, send)


async def _no_body() -> Message:
    return {"type": "http.disconnect"}


def install(app: Any) -> None:
    """Add the limits to `app` with this deployment's upload limit and request threads, and each tenant's share of
    the threads (api/fair_share.py) outermost: a request past it is refused before its body is read."""
    from storage.protocols import PROTOCOLS
    from storage.settings import get_settings

    settings = get_settings()
    app.add_middleware(
        RequestLimits,
        upload_max_bytes=settings.upload_max_bytes,
        threads=settings.api_threads,
        upload_part_max_bytes=settings.upload_part_max_bytes,
        streamed_creates={
            path: protocol.streamed_create_max_bytes(settings)
            for protocol in PROTOCOLS.values()
            for path in (protocol.streamed_create, protocol.streamed_estimate)
            if path is not None
        },
    )
    if settings.tenant_request_share:
        app.add_middleware(TenantShare, limit=settings.tenant_request_share)
