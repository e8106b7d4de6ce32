"""A Celery worker that stops on its own (not asked to) exits non-zero, so its supervisor restarts it.

`make chaos` (seed 52) found the io worker stopping for good after a Redis restart: kombu failed in an
ack, Celery logged `Unrecoverable error` and stopped with exit code 1, and `backfill worker` turned that
into 0, so a restart policy of `on-failure` (systemd, a bare supervisor) left ingest, finalize and the
reaper down. Here the consumer fails the same way on start (an exception Celery cannot recover from).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import Backend

ROOT = Path(__file__).resolve().parents[3]
REDIS_URL = "redis://127.0.0.1:6379/8"

# Run the real `backfill worker --role io` with Celery's consumer failing as kombu's ack did.
_SCRIPT = """
import sys
from celery.worker.consumer import consumer

def broken(self):
    raise AttributeError("'NoneType' object has no attribute 'hostname'")

consumer.Consumer.start = broken
from worker.cli.main import main
sys.exit(main(["worker", "--role", "io", "--metrics-port", "0"]))
"""


def test_an_io_worker_that_celery_stops_on_an_unrecoverable_error_exits_non_zero(backend: Backend) -> None:
    if backend.name != "postgres":
        pytest.skip("the Celery deployment runs on Postgres + Redis")
    env = {**os.environ, **backend.env, "BACKFILL_REDIS_URL": REDIS_URL}
    done = subprocess.run(
        [sys.executable, "-c", _SCRIPT], env=env, cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert "Unrecoverable error" in done.stderr + done.stdout
    assert done.returncode != 0, done.stderr[-2000:]


def test_an_io_worker_stopped_by_sigterm_exits_zero(backend: Backend, tmp_path: Path) -> None:
    if backend.name != "postgres":
        pytest.skip("the Celery deployment runs on Postgres + Redis")
    import signal
    import time

    log = tmp_path / "io.log"
    env = {**os.environ, **backend.env, "BACKFILL_REDIS_URL": REDIS_URL}
    with log.open("wb") as out:
        worker = subprocess.Popen(
            [sys.executable, "-m", "worker.cli", "worker", "--role", "io", "--metrics-port", "0"],
            env=env,
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 60
        while "ready." not in log.read_text() and time.monotonic() < deadline:
            time.sleep(0.2)
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(30) == 0, log.read_text()[-2000:]
