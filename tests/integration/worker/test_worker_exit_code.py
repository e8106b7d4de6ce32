"""A Celery worker that stops on its own (not asked to) starts itself again; one that keeps stopping exits 1.

`make chaos` (seeds 52 and 25) found the io worker stopping for good after a Redis restart: kombu failed in
an ack, Celery logged `Unrecoverable error` and stopped, and `backfill worker` exited 0, so ingest, finalize
and the reaper stayed down (4 batches stuck). Here the consumer fails the same way on start (an exception
Celery cannot recover from); the restarted image is the plain command, which then serves normally.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
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


def test_an_io_worker_that_celery_stops_on_an_unrecoverable_error_restarts_itself(
    backend: Backend, tmp_path: Path
) -> None:
    if backend.name != "postgres":
        pytest.skip("the Celery deployment runs on Postgres + Redis")
    log = tmp_path / "io.log"
    env = {**os.environ, **backend.env, "BACKFILL_REDIS_URL": REDIS_URL}
    with log.open("wb") as out:
        worker = subprocess.Popen([sys.executable, "-c", _SCRIPT], env=env, cwd=ROOT, stdout=out, stderr=out)
        try:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                text = log.read_text()
                if "restarting" in text and "ready." in text.split("restarting", 1)[1]:
                    break
                time.sleep(0.2)
            text = log.read_text()
            assert "Unrecoverable error" in text and "restarting" in text, text[-2000:]
            assert "ready." in text.split("restarting", 1)[1] and worker.poll() is None, text[-2000:]
        finally:
            worker.send_signal(signal.SIGTERM)
            code = worker.wait(30)
    assert code == 0, log.read_text()[-2000:]


def test_an_io_worker_that_keeps_stopping_on_its_own_exits_non_zero(backend: Backend) -> None:
    if backend.name != "postgres":
        pytest.skip("the Celery deployment runs on Postgres + Redis")
    from worker.cli.worker import RESTARTS_MAX

    # As if it had already restarted itself RESTARTS_MAX times within a minute each.
    env = {**os.environ, **backend.env, "BACKFILL_REDIS_URL": REDIS_URL, "_BACKFILL_WORKER_RESTARTS": str(RESTARTS_MAX)}
    done = subprocess.run(
        [sys.executable, "-c", _SCRIPT], env=env, cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert "Unrecoverable error" in done.stderr + done.stdout
    assert done.returncode == 1, done.stderr[-2000:]


def test_an_io_worker_stopped_by_sigterm_exits_zero(backend: Backend, tmp_path: Path) -> None:
    if backend.name != "postgres":
        pytest.skip("the Celery deployment runs on Postgres + Redis")

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
