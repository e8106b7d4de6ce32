"""No secret reaches a log: access logs redact keys in URLs, the finance page takes none, SQL stays silent (item 7)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.conftest import Backend, free_port, make_key

pytestmark = pytest.mark.backfill_env({"BACKFILL_MODELS": '{"fake-model": {"path": "fake:"}}'})


class Captured(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@pytest.fixture
def served(backend: Backend) -> Iterator[tuple[str, Captured]]:
    """The API under uvicorn with the logging config `backfill serve` uses, its access log captured."""
    import uvicorn

    from api.app import create_app
    from api.logs import uvicorn_log_config

    port = free_port()
    config = uvicorn.Config(create_app(), host="127.0.0.1", port=port, log_config=uvicorn_log_config())
    captured = Captured()
    logging.getLogger("uvicorn.access").addHandler(captured)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{port}"
    for _ in range(200):
        try:
            httpx.get(f"{base}/health", timeout=1)
            break
        except httpx.HTTPError:
            time.sleep(0.05)
    yield base, captured
    server.should_exit = True
    thread.join(10)
    logging.getLogger("uvicorn.access").removeHandler(captured)


def test_a_key_in_a_url_is_redacted_from_the_access_log_and_refused(served: tuple[str, Captured]) -> None:
    base, captured = served
    key = make_key("acme")
    page = httpx.get(f"{base}/finance", params={"key": key, "days": "7"})
    assert page.status_code == 400 and "Never put an API key in a URL" in page.json()["error"]["message"]
    httpx.get(f"{base}/v1/models", params={"api_key": key}, headers={"Authorization": f"Bearer {key}"})
    time.sleep(0.2)
    logged = "\n".join(captured.lines)
    assert "/finance?key=[REDACTED]&days=7" in logged
    assert "api_key=[REDACTED]" in logged
    assert key not in logged and key[6:] not in logged


def test_the_finance_page_reads_its_key_from_the_fragment_never_the_query(served: tuple[str, Captured]) -> None:
    base, _ = served
    page = httpx.get(f"{base}/finance")
    assert page.status_code == 200
    assert 'location.hash.slice(1)).get("key")' in page.text  # a fragment never reaches a server
    assert 'params.get("key")' not in page.text


def test_sql_is_not_logged_at_any_level_unless_asked(backend: Backend, monkeypatch: pytest.MonkeyPatch) -> None:
    from storage.db import transaction
    from storage.tenants import authenticate
    from worker.cli.main import configure_logging

    monkeypatch.setenv("BACKFILL_LOG_LEVEL", "DEBUG")
    root = logging.getLogger()
    level = root.level
    captured = Captured()
    root.addHandler(captured)
    try:
        configure_logging()
        root.setLevel(logging.DEBUG)
        key = make_key("acme")
        with transaction() as session:
            authenticate(session, key=key)
    finally:
        root.removeHandler(captured)
        root.setLevel(level)
    logged = "\n".join(captured.lines)
    assert "SELECT" not in logged and "key_hash" not in logged and "INSERT" not in logged
