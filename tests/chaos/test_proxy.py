"""The S3 fault proxy: forwards while up, refuses or resets while down, forwards again once up."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest

from tests.chaos.procs import free_port
from tests.chaos.proxy import FaultProxy


@pytest.fixture
def echo_port() -> Iterator[int]:
    """A TCP server that echoes one message per connection."""
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            with conn:
                conn.sendall(conn.recv(1024))

    threading.Thread(target=serve, daemon=True).start()
    yield port
    server.close()


def ask(port: int) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=2) as conn:
        conn.sendall(b"ping")
        return conn.recv(1024)


@pytest.mark.parametrize("mode", ["refuse", "reset"])
def test_the_proxy_makes_its_upstream_unreachable_and_back(echo_port: int, mode: str) -> None:
    proxy = FaultProxy(port=free_port(), upstream_port=echo_port)
    proxy.start()
    try:
        assert ask(proxy.port) == b"ping"
        proxy.down(mode)  # type: ignore[arg-type]
        with pytest.raises(OSError):
            reply = ask(proxy.port)
            if not reply:  # a reset can surface as an empty read rather than an error
                raise ConnectionResetError
        proxy.up()
        assert ask(proxy.port) == b"ping"
    finally:
        proxy.close()
