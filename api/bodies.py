"""Request bodies read as they arrive by a sync route (on its worker thread), never held whole."""

from __future__ import annotations

from collections.abc import Iterator

import anyio.from_thread
from starlette.requests import ClientDisconnect, Request

from storage.errors import InvalidRequest


def body_chunks(request: Request, *, gather_bytes: int = 0) -> Iterator[bytes]:
    """The body's chunks, each fetched from the event loop's stream by the calling worker thread.

    With `gather_bytes`, chunks are joined up to about that size per trip to the event loop (the server
    hands over 64 KiB or less at a time, and each trip is a thread hop). A client that goes away mid-body
    is a 400 no one reads; api/limits.py's cut-off of an oversized body passes through as raised.
    """
    stream = request.stream().__aiter__()

    async def receive() -> bytes | None:
        parts: list[bytes] = []
        size = 0
        try:
            while size < gather_bytes or not parts:
                part = await stream.__anext__()
                parts.append(part)
                size += len(part)
        except StopAsyncIteration:
            if not parts:
                return None
        except ClientDisconnect:
            raise InvalidRequest("The client closed the connection before the body ended.") from None
        return parts[0] if len(parts) == 1 else b"".join(parts)

    while (chunk := anyio.from_thread.run(receive)) is not None:
        if chunk:
            yield chunk
