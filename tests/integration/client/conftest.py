from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import Backend, LiveServer, make_key, start_server
from tests.integration.client.terminal import cli_env
from worker.cli.main import main


@pytest.fixture
def server(backend: Backend) -> Iterator[LiveServer]:
    """The real API over HTTP with the in-process worker (the fake engine, from each module's settings)."""
    live, stop = start_server(with_worker=True)
    yield live
    stop()


@pytest.fixture
def key(server: LiveServer) -> str:
    return make_key("acme")


@pytest.fixture
def env(server: LiveServer, key: str, tmp_path: Path) -> dict[str, str]:
    """A user's shell pointed at the server with acme's key."""
    return cli_env(server.base_url, key, tmp_path / "client-data")


@pytest.fixture
def cli(server: LiveServer, key: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]):  # type: ignore[no-untyped-def]
    """`backfill ARGS` in this process (the same `main` the console script runs): (exit code, stdout, stderr)."""
    monkeypatch.setenv("BACKFILL_BASE_URL", server.base_url)
    monkeypatch.setenv("BACKFILL_API_KEY", key)

    def run(*args: str) -> tuple[int, str, str]:
        capsys.readouterr()
        code = main(list(args))
        out, err = capsys.readouterr()
        return code, out, err

    return run
