"""A real HTTP webhook receiver on 127.0.0.1 for tests: records every POST, answers from a script."""

from __future__ import annotations

import http.server
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Received:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    at: float


@dataclass
class Reply:
    status: int = 200
    body: bytes = b"ok"
    headers: dict[str, str] = field(default_factory=dict)
    delay_seconds: float = 0.0
    byte_every_seconds: float = 0.0  # > 0: after the headers, the body one byte at a time (a hostile trickle)
    trickle_headers: bool = False  # with byte_every_seconds: the status line and headers trickle too


class Receiver:
    """POSTs are answered with the scripted replies in order, then with `default`."""

    def __init__(self) -> None:
        self.received: list[Received] = []
        self.script: list[Reply] = []
        self.default = Reply()
        self.lock = threading.Lock()
        self.arrived = threading.Condition(self.lock)
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def _handler(self) -> type[http.server.BaseHTTPRequestHandler]:
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # a followed redirect would arrive as a GET
                self.do_POST()

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                with receiver.lock:
                    reply = receiver.script.pop(0) if receiver.script else receiver.default
                    receiver.received.append(
                        Received(
                            self.command, self.path, {k.lower(): v for k, v in self.headers.items()}, body, time.time()
                        )
                    )
                    receiver.arrived.notify_all()
                time.sleep(reply.delay_seconds)
                if reply.trickle_headers:
                    head = f"HTTP/1.1 {reply.status} OK\r\ncontent-length: {len(reply.body)}\r\n\r\n".encode()
                    self._trickle(head + reply.body, reply.byte_every_seconds)
                    return
                try:
                    self.send_response(reply.status)
                    for name, value in reply.headers.items():
                        self.send_header(name, value)
                    self.send_header("content-length", str(len(reply.body)))
                    self.end_headers()
                    if not reply.byte_every_seconds:
                        self.wfile.write(reply.body)
                    for byte in reply.body if reply.byte_every_seconds else b"":
                        self.wfile.write(bytes([byte]))
                        self.wfile.flush()
                        time.sleep(reply.byte_every_seconds)
                except (BrokenPipeError, ConnectionResetError):  # the sender timed out and hung up
                    pass

            def _trickle(self, data: bytes, every_seconds: float) -> None:
                try:
                    for byte in data:
                        self.wfile.write(bytes([byte]))
                        self.wfile.flush()
                        time.sleep(every_seconds)
                except (BrokenPipeError, ConnectionResetError):
                    pass

            def log_message(self, format: str, *args: object) -> None:
                pass

        return Handler

    def wait_for(self, count: int, timeout: float = 30) -> list[Received]:
        """Block until `count` POSTs have arrived; return them all."""
        deadline = time.time() + timeout
        with self.arrived:
            while len(self.received) < count:
                left = deadline - time.time()
                if left <= 0:
                    raise AssertionError(f"expected {count} webhook posts, got {len(self.received)}")
                self.arrived.wait(left)
            return list(self.received)


@contextmanager
def running_receiver() -> Iterator[Receiver]:
    receiver = Receiver()
    thread = threading.Thread(target=receiver.server.serve_forever, daemon=True)
    thread.start()
    try:
        yield receiver
    finally:
        receiver.server.shutdown()
        receiver.server.server_close()


# Settings for tests that deliver to a receiver on this machine: plain http and 127.0.0.1 allowed, fast retries.
WEBHOOK_TEST_ENV = {
    "BACKFILL_WEBHOOK_ALLOW_HTTP": "true",
    "BACKFILL_WEBHOOK_ALLOWED_NETWORKS": "127.0.0.1/32",
    "BACKFILL_WEBHOOK_RETRY_BASE_SECONDS": "0.2",
    "BACKFILL_REAP_INTERVAL_SECONDS": "1",
}
