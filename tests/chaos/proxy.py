"""A small TCP fault proxy: "S3 is down" without losing the objects moto keeps in memory.

Backfill talks to S3 through this proxy. `down("refuse")` stops listening (new connections are refused)
and resets every open connection; `down("reset")` keeps listening but resets each connection as soon as
it is accepted. `up()` forwards again. It runs an asyncio loop in a daemon thread of the harness.
"""

from __future__ import annotations

import asyncio
import socket
import struct
import threading
from typing import Literal

Mode = Literal["up", "refuse", "reset"]
_LINGER_RESET = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close() sends RST instead of FIN


class FaultProxy:
    """Forwards 127.0.0.1:`port` to 127.0.0.1:`upstream_port` unless told to fail."""

    def __init__(self, *, port: int, upstream_port: int) -> None:
        self.port = port
        self.upstream_port = upstream_port
        self.mode: Mode = "up"
        self.connections = 0  # accepted since start (a test can see traffic went through)
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.Server | None = None
        self._open: set[asyncio.StreamWriter] = set()
        self._thread = threading.Thread(target=self._loop.run_forever, name="s3-fault-proxy", daemon=True)

    def start(self) -> None:
        self._thread.start()
        self._call(self._listen())

    def close(self) -> None:
        if not self._thread.is_alive():
            return
        self._call(self._shutdown())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)

    def down(self, mode: Literal["refuse", "reset"] = "refuse") -> None:
        """Make S3 unreachable; open connections are reset either way."""
        self._call(self._set_mode(mode))

    def up(self) -> None:
        self._call(self._set_mode("up"))

    def _call(self, coroutine: object) -> None:
        asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(10)  # type: ignore[arg-type]

    async def _set_mode(self, mode: Mode) -> None:
        self.mode = mode
        if mode == "refuse" and self._server is not None:
            self._server.close()
            self._server = None
        if mode != "refuse" and self._server is None:
            await self._listen()
        if mode != "up":
            for writer in list(self._open):
                _reset(writer)

    async def _listen(self) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", self.port, reuse_address=True)

    async def _shutdown(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        for writer in list(self._open):
            _reset(writer)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        if self.mode != "up":
            _reset(writer)
            return
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        except OSError:
            _reset(writer)
            return
        self._open.update((writer, up_writer))
        try:
            await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
        finally:
            self._open.difference_update((writer, up_writer))
            for side in (writer, up_writer):
                side.close()


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except (ConnectionError, OSError, asyncio.CancelledError):
        _reset(writer)


def _reset(writer: asyncio.StreamWriter) -> None:
    sock = writer.get_extra_info("socket")
    if sock is not None:
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_RESET)
        except OSError:
            pass
    writer.transport.abort()
