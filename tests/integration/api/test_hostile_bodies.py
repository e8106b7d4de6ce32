"""Every request body, on every route, is read by one bounded reader (issue 18 items 1, 2 and 4).

Depth is counted over the streamed bytes before anything is built, values are parsed strictly, and the
worst body the rules allow grows the server's memory by a bounded amount while /health keeps answering.
"""

from __future__ import annotations

import ast
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import orjson
import psutil
import pytest

from tests.conftest import Backend, LiveServer, make_key, start_server

pytestmark = pytest.mark.backfill_env({"BACKFILL_MODELS": '{"fake-model": {"path": "fake:"}}'})

ROOT = Path(__file__).resolve().parents[3]
ATTACK = b'{"requests":[{"custom_id":"q0","params":{"model":"backfill-demo","max_tokens":4,"x":' + b"[" * 100_000


@pytest.fixture
def server(backend: Backend) -> Iterator[LiveServer]:
    server, stop = start_server(with_worker=False)
    yield server
    stop()


def post(server: LiveServer, path: str, key: str, content: bytes, timeout: float = 120) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    return httpx.post(f"{server.base_url}{path}", content=content, headers=headers, timeout=timeout)


def message_request(custom_id: str, **params: object) -> dict[str, object]:
    body = {"model": "fake-model", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}], **params}
    return {"custom_id": custom_id, "params": body}


def anthropic_error(response: httpx.Response, status: int) -> str:
    assert response.status_code == status, response.text[:500]
    body = response.json()
    assert body["type"] == "error" and set(body["error"]) == {"type", "message"}
    return str(body["error"]["message"])


def openai_error(response: httpx.Response, status: int) -> str:
    assert response.status_code == status, response.text[:500]
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    return str(error["message"])


# -- item 1: the depth attack -----------------------------------------------------------------------------------


def test_the_100k_bracket_body_is_a_400_in_anthropics_envelope(server: LiveServer) -> None:
    message = anthropic_error(post(server, "/v1/messages/batches", make_key("acme"), ATTACK), 400)
    assert "nests deeper than 64 levels" in message


@pytest.mark.parametrize("depth", [256, 1000, 5000])
def test_params_nested_past_orjsons_limit_are_the_requests_problem_not_a_500(server: LiveServer, depth: int) -> None:
    deep = b"[" * depth + b"]" * depth
    good = orjson.dumps(message_request("fine"))
    body = b'{"requests":[' + good + b',{"custom_id":"deep","params":{"x":' + deep + b"}}]}"
    message = anthropic_error(post(server, "/v1/messages/batches", make_key("acme"), body), 400)
    assert "1 invalid requests (indices 1): requests.1: nests deeper than 64 levels" in message


# -- item 2: a message batch as large as documented --------------------------------------------------------------


def test_a_100000_request_message_batch_is_accepted(server: LiveServer) -> None:
    """The 1 MiB body limit stopped message batches at ~8,300 small requests."""
    parts = [orjson.dumps(message_request(f"r{i}")) for i in range(100_000)]
    body = b'{"requests":[' + b",".join(parts) + b"]}"
    assert len(body) > 10 * 1024 * 1024
    response = post(server, "/v1/messages/batches", make_key("acme"), body)
    assert response.status_code == 200, response.text[:500]
    assert response.json()["request_counts"]["processing"] == 100_000


def test_one_request_over_its_limit_is_named_by_index_while_the_body_streams(server: LiveServer) -> None:
    big = orjson.dumps(message_request("big", system="s" * (3 * 1024 * 1024)))
    body = b'{"requests":[' + orjson.dumps(message_request("a")) + b"," + big + b"]}"
    message = anthropic_error(post(server, "/v1/messages/batches", make_key("acme"), body), 400)
    assert "requests.1: larger than" in message


def test_errors_on_anthropic_paths_leave_in_anthropics_envelope(server: LiveServer) -> None:
    key = make_key("acme")
    assert "not valid JSON" in anthropic_error(post(server, "/v1/messages/batches/msgbatch_x/cancel", key, b"{"), 400)
    oversized = b'{"x":"' + b"a" * (2 * 1024 * 1024) + b'"}'
    assert "byte limit" in anthropic_error(post(server, "/v1/messages/batches/msgbatch_x/cancel", key, oversized), 413)


def test_nul_is_data_in_params_but_never_in_a_model_name(api: LiveServer) -> None:
    """A model name lands in a text column (Postgres cannot hold NUL); message content is JSON data."""
    import anthropic

    key = make_key("acme")
    bad = orjson.dumps({"requests": [message_request("a", model="fake\u0000model")]})
    message = anthropic_error(post(api, "/v1/messages/batches", key, bad), 400)
    assert "requests.0.params.model: contains a NUL character" in message
    content = [{"role": "user", "content": "a\u0000b"}]
    client = anthropic.Anthropic(api_key=key, base_url=api.base_url, max_retries=0)
    batch = client.messages.batches.create(requests=[message_request("n", messages=content)])  # type: ignore[list-item]
    deadline = time.monotonic() + 60
    while client.messages.batches.retrieve(batch.id).processing_status != "ended" and time.monotonic() < deadline:
        time.sleep(0.2)
    assert [line.result.type for line in client.messages.batches.results(batch.id)] == ["succeeded"]


# -- item 4: 500s that dropped the connection ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "raw", "reason"),
    [
        (
            "/v1/batches",
            b'{"input_file_id":"file-x","endpoint":"/v1/chat/completions","completion_window":"24h","metadata":{"k":"\\ud800"}}',
            "not valid JSON",
        ),
        (
            "/v1/batches",
            b'{"input_file_id":"file-x","endpoint":"/v1/chat/completions","completion_window":"24h","metadata":{"\\ud800":"v"}}',
            "not valid JSON",
        ),
        (
            "/v1/batches/estimate",
            b'{"input_file_id":"file-x","endpoint":"/v1/chat/completions","completion_window":"24h","metadata":{"k":"\\udfff"}}',
            "not valid JSON",
        ),
        (
            "/v1/batches",
            b'{"input_file_id":"file-x","metadata":' + b"[" * 3000 + b"]" * 3000 + b"}",
            "nests deeper than 64",
        ),
        ("/v1/webhook_endpoints", b'{"url":"https://example.com/hook","name":"a\\u0000b"}', "NUL"),
        (
            "/v1/webhook_endpoints",
            b'{"url":"https://example.com/hook","name":"a","metadata":{"n":18446744073709551615}}',
            "64-bit",
        ),
        ("/v1/batches", b'{"input_file_id":"file-\xff"}', "not valid JSON"),
    ],
)
def test_hostile_values_are_400s_in_openais_envelope(server: LiveServer, path: str, raw: bytes, reason: str) -> None:
    assert reason in openai_error(post(server, path, make_key("acme"), raw), 400)


# -- the discipline: one reader, bounded memory, /health answers ---------------------------------------------------


def body_routes() -> list[tuple[str, str]]:
    from api.app import create_app

    routes = []
    for route in create_app().routes:
        for method in sorted(getattr(route, "methods", set()) & {"POST", "PUT", "PATCH"}):
            routes.append((method, route.path))  # type: ignore[attr-defined]
    return routes


def test_every_body_taking_route_reads_its_body_through_the_bounded_reader() -> None:
    """Only the middleware (small bodies, before FastAPI's own parse) and the two streamed routes touch a
    body, the streamed ones through api/bodies.py; no route reads one another way."""
    from api.limits import UPLOAD_PATH
    from storage.protocols import ANTHROPIC

    MESSAGE_BATCHES_PATH = ANTHROPIC.streamed_create

    assert ("POST", UPLOAD_PATH) in body_routes() and ("POST", MESSAGE_BATCHES_PATH) in body_routes()
    offenders = []
    for path in (ROOT / "api").rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                name = node.func.attr
                owner = ast.unparse(node.func.value)
                if name in {"json", "body", "form"} and owner == "request":
                    offenders.append(f"{path.relative_to(ROOT)}:{node.lineno} request.{name}()")
                if name == "stream" and owner == "request" and path.name != "bodies.py":
                    offenders.append(f"{path.relative_to(ROOT)}:{node.lineno} request.stream()")
    assert offenders == []


def worst_small_body() -> bytes:
    """1 MiB of the most objects the rules allow: nests 64 deep, every level a list of empty lists."""
    unit = b"[" * 63 + b"[]" + b"]" * 63
    return b'{"metadata":[' + b",".join([unit] * ((1024 * 1024 - 64) // (len(unit) + 1))) + b"]}"


def measured(server: LiveServer, send: Callable[[], httpx.Response]) -> tuple[httpx.Response, int, float]:
    """Send one body; (its response, the process's peak RSS growth in bytes, the slowest /health answer)."""
    process = psutil.Process()
    baseline = process.memory_info().rss
    peak = baseline
    slowest = 0.0
    done = threading.Event()
    result: list[httpx.Response] = []

    def run() -> None:
        try:
            result.append(send())
        finally:
            done.set()

    thread = threading.Thread(target=run)
    thread.start()
    with httpx.Client(timeout=10) as client:
        while not done.is_set():
            started = time.monotonic()
            assert client.get(f"{server.base_url}/health").status_code == 200
            slowest = max(slowest, time.monotonic() - started)
            peak = max(peak, process.memory_info().rss)
            time.sleep(0.02)
    thread.join()
    return result[0], peak - baseline, slowest


@pytest.mark.parametrize(("method", "path"), body_routes())
def test_the_worst_body_each_route_allows_keeps_memory_bounded_and_health_answering(
    server: LiveServer, backend: Backend, method: str, path: str
) -> None:
    if backend.name != "embedded":
        pytest.skip("memory is measured once, on the embedded server")
    key = make_key("acme")
    url = server.base_url + path.replace("{", "x").replace("}", "")
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    # the Anthropic create gets the attack, closed: walked to the end, never built
    body = ATTACK + b"]" * 100_000 + b"}}]}" if path == "/v1/messages/batches" else worst_small_body()
    response, grown, slowest = measured(
        server, lambda: httpx.request(method, url, content=body, headers=headers, timeout=120)
    )
    assert response.status_code < 500, response.text[:300]
    assert grown < 150 * 1024 * 1024, f"RSS grew {grown / 2**20:.0f} MiB"
    assert slowest < 1.0, f"/health took {slowest:.2f} s"


@pytest.mark.backfill_env({"BACKFILL_MODELS": '{"fake-model": {"path": "fake:"}}', "BACKFILL_API_THREADS": "2"})
def test_health_answers_while_slow_bodies_hold_every_request_thread(backend: Backend) -> None:
    """Clients trickling Anthropic create bodies hold the request threads; /health must not queue behind them."""
    if backend.name != "embedded":
        pytest.skip("one backend is enough: the request threads are the API's own")
    server, stop = start_server(with_worker=False)
    keys = [make_key(f"acme-{i}") for i in range(3)]  # a tenant each: one tenant's share is 1 of the 2 threads
    release = threading.Event()

    def trickle() -> Iterator[bytes]:
        yield b'{"requests":['
        release.wait(30)
        yield b"]}"

    def slow_create(key: str) -> None:
        headers = {"x-api-key": key, "content-type": "application/json"}
        httpx.post(f"{server.base_url}/v1/messages/batches", content=trickle(), headers=headers, timeout=60)

    senders = [threading.Thread(target=slow_create, args=(key,)) for key in keys]
    try:
        for sender in senders:
            sender.start()
        time.sleep(1)  # not a race: the check below holds whether or not the bodies are in by now
        started = time.monotonic()
        assert httpx.get(f"{server.base_url}/health", timeout=10).status_code == 200
        assert time.monotonic() - started < 1.0
    finally:
        release.set()
        for sender in senders:
            sender.join()
        stop()
