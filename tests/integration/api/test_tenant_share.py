"""No tenant can starve the request threads (issue 36 §11): each tenant has a share of them (api/fair_share.py).

With 8 request threads and a share of 2, tenant A opens 8 uploads whose bodies stop half way: before the share
they held all 8 threads and tenant B's simple GETs waited until they ended. Now A's first 2 are served, the other
6 are answered 429 with Retry-After at once, B's GETs answer while A's 2 uploads still hold their threads, A's
next call through either SDK is a 429 in its protocol's envelope, and the official SDK's own retry of a 429
succeeds once A's uploads are done. Nothing here depends on timing: the slow requests are held by the test
until it lets them go. B's latency under 100 of A's clients is measured by bench/tenant_share.py.
"""

from __future__ import annotations

import json
import select
import socket
from collections.abc import Iterator
from urllib.parse import urlsplit

import anthropic
import httpx
import openai
import pytest

from tests.conftest import LiveServer, make_key, start_server
from tests.integration.api.helpers import chat_line, to_jsonl

THREADS, SHARE = 8, 2
pytestmark = pytest.mark.backfill_env(
    {
        "BACKFILL_MODELS": '{"fake-model": {"path": "fake:"}}',
        "BACKFILL_API_THREADS": str(THREADS),
        "BACKFILL_TENANT_MAX_CONCURRENT_REQUESTS": str(SHARE),
    }
)
BOUNDARY = "backfill-share"


@pytest.fixture
def server(backend: object) -> Iterator[LiveServer]:
    server, stop = start_server(with_worker=False)
    yield server
    stop()


class HeldUpload:
    """An upload sent over a raw socket up to the middle of its file, then held until `finish`."""

    def __init__(self, base_url: str, key: str) -> None:
        content = to_jsonl([chat_line(0)])
        head = (
            f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n'
            f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="file"; filename="held.jsonl"\r\n'
            "Content-Type: application/octet-stream\r\n\r\n"
        ).encode() + content[:10]
        self.rest = content[10:] + f"\r\n--{BOUNDARY}--\r\n".encode()
        url = urlsplit(base_url)
        self.sock = socket.create_connection((url.hostname, url.port), timeout=60)
        request = (
            f"POST /v1/files HTTP/1.1\r\nHost: {url.netloc}\r\nAuthorization: Bearer {key}\r\n"
            f"Content-Type: multipart/form-data; boundary={BOUNDARY}\r\n"
            f"Content-Length: {len(head) + len(self.rest)}\r\n\r\n"
        ).encode()
        self.sock.sendall(request + head)

    def answered(self) -> bool:
        return bool(select.select([self.sock], [], [], 0)[0])

    def response(self) -> tuple[int, dict[str, str], dict[str, object]]:
        """Status, headers and JSON body of the answer (read to the end of its Content-Length)."""
        data = b""
        while b"\r\n\r\n" not in data:
            data += self.sock.recv(65536)
        head, body = data.split(b"\r\n\r\n", 1)
        lines = head.decode().split("\r\n")
        headers = {name.lower(): value.strip() for name, value in (line.split(":", 1) for line in lines[1:])}
        while len(body) < int(headers["content-length"]):
            body += self.sock.recv(65536)
        return int(lines[0].split()[1]), headers, json.loads(body)

    def finish(self) -> tuple[int, dict[str, object]]:
        self.sock.sendall(self.rest)
        status, _, body = self.response()
        self.sock.close()
        return status, body


def wait_answered(uploads: list[HeldUpload], count: int) -> list[HeldUpload]:
    """Block until `count` of the uploads have an answer (the 429s come at once; the held ones cannot answer)."""
    answered: list[HeldUpload] = []
    while len(answered) < count:
        ready, _, _ = select.select([u.sock for u in uploads if u not in answered], [], [], 30)
        assert ready, f"only {len(answered)} of {len(uploads)} uploads answered; expected {count} refused at once"
        answered += [u for u in uploads if u.sock in ready]
    return answered


def test_a_tenant_holding_its_share_of_threads_gets_429_while_another_tenant_is_served(server: LiveServer) -> None:
    key_a, key_b = make_key("hog"), make_key("neighbour")
    uploads = [HeldUpload(server.base_url, key_a) for _ in range(THREADS)]  # before the share: every thread
    try:
        refused = wait_answered(uploads, THREADS - SHARE)
        for upload in refused:
            status, headers, body = upload.response()
            assert status == 429 and headers["retry-after"] == "1", body
            assert body["error"]["code"] == "rate_limit_exceeded"  # type: ignore[index]
        held = [upload for upload in uploads if upload not in refused]
        assert len(held) == SHARE and not any(upload.answered() for upload in held)

        neighbour = openai.OpenAI(api_key=key_b, base_url=f"{server.base_url}/v1", max_retries=0, timeout=30)
        for _ in range(2 * THREADS):  # more calls than threads: each gets one of the threads A cannot take
            assert neighbour.batches.list().data == [] and neighbour.files.list().data == []

        hog = openai.OpenAI(api_key=key_a, base_url=f"{server.base_url}/v1", max_retries=0, timeout=30)
        with pytest.raises(openai.RateLimitError) as limited:
            hog.batches.list()
        assert limited.value.code == "rate_limit_exceeded" and limited.value.response.headers["retry-after"] == "1"
        messages = anthropic.Anthropic(api_key=key_a, base_url=server.base_url, max_retries=0, timeout=30)
        with pytest.raises(anthropic.RateLimitError) as anthropic_limited:
            messages.messages.batches.list()
        assert anthropic_limited.value.body["error"]["type"] == "rate_limit_error"  # type: ignore[index]

        # The SDK's own retry: its first try is refused; A's uploads end then, and the retry after Retry-After
        # (1 s) is served. Both uploads were whole: 200, each a file.
        finished: list[tuple[int, dict[str, object]]] = []

        def on_response(response: httpx.Response) -> None:
            if response.status_code == 429 and not finished:
                finished.extend(upload.finish() for upload in held)

        http = httpx.Client(event_hooks={"response": [on_response]}, timeout=30)
        patient = openai.OpenAI(api_key=key_a, base_url=f"{server.base_url}/v1", max_retries=3, http_client=http)
        assert patient.files.list().data is not None
        assert [status for status, _ in finished] == [200, 200], finished
        assert {body["object"] for _, body in finished} == {"file"}
    finally:
        for upload in uploads:
            upload.sock.close()
