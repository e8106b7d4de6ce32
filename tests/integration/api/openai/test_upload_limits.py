"""Uploads over the limit are refused before the body is read, or as soon as a chunked body passes it (item 6)."""

from __future__ import annotations

import io
import select
import socket
import time
from urllib.parse import urlparse

import pytest

from tests.conftest import LiveServer, make_key

LIMIT = 1024 * 1024
pytestmark = pytest.mark.backfill_env(
    {"BACKFILL_MODELS": '{"fake-model": {"path": "fake:"}}', "BACKFILL_UPLOAD_MAX_BYTES": str(LIMIT)}
)
BOUNDARY = "hostileboundary"
HEAD = (
    f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n'
    f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="file"; filename="big.jsonl"\r\n'
    "Content-Type: application/octet-stream\r\n\r\n"
).encode()
LINE = b'{"custom_id": "r", "method": "POST", "url": "/v1/chat/completions", "body": {"model": "fake-model"}}\n'


def connect(api: LiveServer) -> socket.socket:
    url = urlparse(api.base_url)
    return socket.create_connection((url.hostname, url.port), timeout=10)


def request_head(api: LiveServer, key: str, framing: str) -> bytes:
    return (
        f"POST /v1/files HTTP/1.1\r\nHost: {urlparse(api.base_url).netloc}\r\nAuthorization: Bearer {key}\r\n"
        f"Content-Type: multipart/form-data; boundary={BOUNDARY}\r\n{framing}\r\n\r\n"
    ).encode()


def read_status(sock: socket.socket) -> tuple[int, bytes]:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    return int(data.split(b" ", 2)[1]), data


def test_a_declared_length_over_the_limit_is_refused_before_any_body_is_sent(api: LiveServer) -> None:
    key = make_key("acme")
    with connect(api) as sock:
        sock.sendall(request_head(api, key, f"Content-Length: {50 * 1024 * 1024}"))
        started = time.monotonic()
        status, data = read_status(sock)  # nothing of the body has been sent
    assert status == 413 and b"file_too_large" in data
    assert time.monotonic() - started < 5


def test_a_chunked_body_is_cut_off_soon_after_it_passes_the_limit(api: LiveServer) -> None:
    key = make_key("acme")
    piece = LINE * (65536 // len(LINE))
    sent = 0
    with connect(api) as sock:
        sock.sendall(request_head(api, key, "Transfer-Encoding: chunked"))
        chunks = [HEAD] + [piece] * (64 * 1024 * 1024 // len(piece))
        try:
            for chunk in chunks:
                sock.sendall(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
                sent += len(chunk)
                if select.select([sock], [], [], 0)[0]:
                    break  # the server answered already
            else:
                tail = f"\r\n--{BOUNDARY}--\r\n".encode()
                sock.sendall(f"{len(tail):x}\r\n".encode() + tail + b"\r\n0\r\n\r\n")
        except OSError:
            pass  # the server closed the connection on us after answering
        status, data = read_status(sock)
    assert status == 413 and b"file_too_large" in data
    assert sent < 8 * LIMIT, f"the server read {sent / LIMIT:.0f}x the limit before refusing"
    assert api.client(key).files.list().data == []


def test_an_upload_just_under_the_limit_is_accepted(api: LiveServer) -> None:
    client = api.client(make_key("acme"))
    data = LINE * ((LIMIT - 2048) // len(LINE))
    assert client.files.create(file=("ok.jsonl", io.BytesIO(data)), purpose="batch").bytes == len(data)
