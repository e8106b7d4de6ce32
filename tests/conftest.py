"""Shared fixtures: real Postgres, the moto S3 server over HTTP, a live API server on a free port.

A test picks its backend with the `backend` fixture ("embedded": SQLite + a local folder;
"postgres": Postgres + S3). Settings are process-wide, so fixtures reset every cached factory.
"""

from __future__ import annotations

import os
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

from storage.settings import Settings

os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# The suite runs on PYTEST_WORKERS processes over 2 cores, several of them running an engine (in process or in a
# worker subprocess, which inherits this). An OpenMP pool as wide as the machine in each of them oversubscribes
# the cores and spin-waits: the hand-back test took 89 s beside another engine instead of 9 s. One thread each.
os.environ.setdefault("OMP_NUM_THREADS", "1")

PG_ADMIN_URL = os.environ.get("BACKFILL_TEST_PG_ADMIN", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres")
BACKFILL_ENV = [name for name in os.environ if name.startswith("BACKFILL_")]


# CI (`make test`, which .ci/run calls) must finish in 30 minutes on 2 cores, on whatever machine it gets: one
# machine ran the whole suite in 16 minutes, the next (2.7x slower: 3,953 against 10,776 queue claims/s) in 44.
# So the end-to-end runs and fault drills beyond this core are `long`: `make test-all` runs them with the rest,
# `make chaos` runs many more seeds. The core keeps, in CI, the embedded default on the real vLLM engine, one
# seeded fault run (kill -9 of the io and the GPU worker) and every chaos checker rule.
CI_CORE = (
    "tests/e2e/test_embedded_flow.py",
    "tests/chaos/test_chaos_runs.py::test_a_seeded_fault_run_loses_duplicates_and_leaves_nothing_unexplained[42-",
    *(f"tests/chaos/test_{name}.py" for name in ("adapter_rules", "control_rules", "decode_rules", "history")),
    *(f"tests/chaos/test_{name}.py" for name in ("proxy", "renewal_catch", "workflow_rules")),
)
# The API fuzz runs on the Postgres backend in CI (where a 5xx is likelier: its text, its constraints); its
# embedded case in `make test-all` and `make fuzz`.
LONG_EMBEDDED = ("tests/integration/api/test_openapi_fuzz.py", "tests/integration/api/test_hostile_fuzz.py")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark `long` every end-to-end and chaos test outside CI_CORE, and the embedded cases of LONG_EMBEDDED."""
    for item in items:
        outside = item.nodeid.startswith(("tests/e2e/", "tests/chaos/")) and not item.nodeid.startswith(CI_CORE)
        if outside or (item.nodeid.startswith(LONG_EMBEDDED) and item.nodeid.endswith("[embedded]")):
            item.add_marker(pytest.mark.long)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def reset_caches() -> None:
    """Forget every cached settings-derived object (settings, engine, sessionmaker, blob store, waker)."""
    from storage import wakeups
    from storage.db import get_engine, get_sessionmaker
    from storage.files.blobs import get_blob_store
    from storage.settings import get_settings

    try:
        get_engine().dispose()
    except Exception:
        pass
    for cached in (get_settings, get_engine, get_sessionmaker, get_blob_store, wakeups._default_waker):
        cached.cache_clear()
    wakeups._waker.clear()
    from storage.metrics.queue_state import QUEUE_STATE

    QUEUE_STATE.clear()  # a snapshot read under another test's settings (models, tenants) is not this test's
    from storage.queue.claim_order import drain_cache

    drain_cache.clear()  # keyed by database URL and model: a Postgres test's URL is every Postgres test's


@pytest.fixture(scope="session")
def moto_endpoint() -> Iterator[str]:
    """A real S3 endpoint over HTTP: moto's standalone server, in its own process.

    Its own process, not moto's threaded server: importing Flask into the test process breaks vLLM's
    engine start-up (vLLM inspects module globals and trips over Flask's request proxy).
    """
    import subprocess
    import sys

    os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 30
    while time.time() < deadline:
        try:
            httpx.get(f"{url}/moto-api/", timeout=1)
            break
        except httpx.HTTPError:
            time.sleep(0.1)
    else:  # pragma: no cover
        proc.kill()
        raise RuntimeError("moto server did not start")
    yield url
    proc.terminate()
    proc.wait(10)


@pytest.fixture(scope="session")
def pg_url() -> Iterator[str]:
    """A fresh Postgres database for this test session, dropped at the end."""
    name = f"backfill_test_{uuid.uuid4().hex[:8]}"
    admin = sa.create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    except sa.exc.OperationalError as error:  # pragma: no cover - CI starts Postgres
        pytest.fail(f"Postgres is not reachable at {PG_ADMIN_URL}: {error}")
    yield f"postgresql://postgres@127.0.0.1:5432/{name}"
    with admin.connect() as conn:
        conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


@dataclass
class Backend:
    name: str
    env: dict[str, str]


def configure(monkeypatch: pytest.MonkeyPatch, env: dict[str, str]) -> None:
    """Apply BACKFILL_* settings for one test and reset cached factories."""
    for name in list(os.environ):
        if name.startswith("BACKFILL_"):
            monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    reset_caches()


def _truncate_all() -> None:
    from storage.db import get_engine
    from storage.models import Base

    engine = get_engine()
    with engine.begin() as conn:
        if engine.dialect.name == "postgresql":
            names = ", ".join(table.name for table in Base.metadata.sorted_tables)
            conn.execute(sa.text(f"TRUNCATE {names} CASCADE"))
        else:
            for table in reversed(Base.metadata.sorted_tables):
                conn.execute(table.delete())


_migrated: set[str] = set()


@pytest.fixture(params=["embedded", "postgres"])
def backend(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Backend]:
    """Settings for one backend, migrated with Alembic and emptied before the test."""
    env = {"BACKFILL_DATA_DIR": str(tmp_path / "data"), **getattr(request, "param_env", {})}
    extra = request.node.get_closest_marker("backfill_env")
    if extra:
        env.update(extra.args[0])
    if request.param == "postgres":
        env["BACKFILL_DATABASE_URL"] = request.getfixturevalue("pg_url")
        env["BACKFILL_S3_ENDPOINT_URL"] = request.getfixturevalue("moto_endpoint")
        env["BACKFILL_S3_BUCKET"] = "backfill-test"
    configure(monkeypatch, env)
    from storage.settings import get_settings
    from worker.cli.migrate import migrate_database

    url = get_settings().sqlalchemy_url
    if url not in _migrated:
        migrate_database()
        _migrated.add(url)
    _truncate_all()
    if request.param == "postgres":
        from storage.files.blobs import get_blob_store

        get_blob_store().ensure_bucket()  # type: ignore[attr-defined]
    yield Backend(request.param, env)
    reset_caches()


@pytest.fixture
def session(backend: Backend) -> Iterator[Session]:
    """A session on the test's backend; nothing it does is committed."""
    from storage.db import get_sessionmaker

    session = get_sessionmaker()()
    yield session
    session.rollback()
    session.close()


@pytest.fixture
def settings(backend: Backend) -> Settings:
    """The settings the backend fixture applied."""
    from storage.settings import get_settings

    return get_settings()


@dataclass
class LiveServer:
    base_url: str
    worker: object | None

    def client(self, key: str):  # type: ignore[no-untyped-def]
        import openai

        return openai.OpenAI(api_key=key, base_url=f"{self.base_url}/v1", max_retries=0, timeout=60)


def start_server(*, with_worker: bool) -> tuple[LiveServer, callable]:  # type: ignore[valid-type]
    """Run the real API (uvicorn) in a thread, optionally with the embedded worker."""
    import uvicorn

    from api.app import create_app
    from storage.settings import get_settings
    from worker.process.embedded import EmbeddedWorker

    worker = None
    if with_worker:
        worker = EmbeddedWorker(reap_interval_seconds=get_settings().reap_interval_seconds)
        worker.start()
    port = free_port()
    # A test's clients keep connections open; at stop, uvicorn waits for them at most a second (the default waits
    # for ever, then `stop` gives up after its join's 10 s, per test).
    config = uvicorn.Config(create_app(), host="127.0.0.1", port=port, log_level="warning", timeout_graceful_shutdown=1)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.time() + 30
    while time.time() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            time.sleep(0.05)
    else:  # pragma: no cover
        raise RuntimeError("API did not start")

    def stop() -> None:
        server.should_exit = True
        thread.join(10)
        if worker is not None:
            worker.shutdown()

    return LiveServer(f"http://127.0.0.1:{port}", worker), stop


def make_key(tenant: str, *, admin: bool = False) -> str:
    from storage.db import transaction
    from storage.tenants import create_api_key

    with transaction() as session:
        return create_api_key(session, tenant_name=tenant, is_admin=admin)
