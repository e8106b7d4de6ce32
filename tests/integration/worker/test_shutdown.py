"""A GPU worker told to stop (SIGTERM: a pod deleted, a rollout, a drained node) hands its in-flight work back.

The rows go back to `queued` at once with their attempt not counted, so another worker of the model
claims them now instead of after the lease expires, and a worker stopped mid-request costs no attempt.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import redis
from sqlalchemy import select

from storage.db import transaction
from storage.models import BatchRequest
from storage.settings import get_settings
from storage.wakeups import CeleryWaker, set_waker
from tests.conftest import Backend
from tests.integration.jobs import chat, submit_job
from tests.integration.worker.processes import start_worker
from worker import shutdown
from worker.engine.fake import FakeEngine
from worker.runner import Runner

REDIS_URL = "redis://127.0.0.1:6379/14"
FAKE = {"path": "fake:", "max_num_seqs": 8, "max_model_len": 100_000, "extra": {"step_seconds": 0.02}}

pytestmark = pytest.mark.backfill_env({"BACKFILL_MODELS": json.dumps({"fake-model": FAKE})})


class Wakes:
    def __init__(self) -> None:
        self.sent: list[tuple[str, dict[str, Any]]] = []

    def send(self, task: str, kwargs: dict[str, Any]) -> None:
        self.sent.append((task, kwargs))


def rows(batch_id: str) -> list[BatchRequest]:
    with transaction() as session:
        return list(session.scalars(select(BatchRequest).where(BatchRequest.batch_id == batch_id)))


def holding_runner(lines: int, *, max_tokens: int) -> tuple[str, Runner]:
    batch_id, status = submit_job([chat(i, max_tokens=max_tokens) for i in range(lines)])
    assert status == "in_progress"
    engine = FakeEngine("fake-model", max_num_seqs=8, max_model_len=100_000, step_seconds=0.01)
    runner = Runner(engine, model="fake-model", settings=get_settings(), worker_id="gpu-stopping")
    runner.run_for(0.3)  # one `batch.run` task: everything claimed, still decoding
    assert len(runner.inflight) == lines
    return batch_id, runner


def test_a_stopping_worker_hands_in_flight_work_back_unrun_and_another_worker_finishes_it_once(
    backend: Backend,
) -> None:
    wakes = Wakes()
    set_waker(wakes)
    batch_id, stopping = holding_runner(6, max_tokens=1000)

    assert shutdown.hand_back(stopping, drain_seconds=0) == 6

    back = rows(batch_id)
    assert {(row.status, row.attempts, row.lease_owner) for row in back} == {("queued", 0, None)}
    assert not stopping.engine.has_unfinished()
    assert wakes.sent == [("batch.run", {"model": "fake-model"})]  # the model's other workers claim them now
    engine = FakeEngine("fake-model", max_num_seqs=8, max_model_len=100_000)
    other = Runner(engine, model="fake-model", settings=get_settings(), worker_id="gpu-other")
    while other.run_for(5.0):
        pass
    done = rows(batch_id)
    assert {(row.status, row.attempts, row.lease_owner) for row in done} == {("completed", 1, None)}
    assert sorted(row.custom_id for row in done) == [f"r{i}" for i in range(6)]


def test_work_that_finishes_within_the_drain_is_recorded_not_handed_back(backend: Backend) -> None:
    set_waker(wakes := Wakes())
    batch_id, stopping = holding_runner(4, max_tokens=40)  # ~0.4 s of steps left: inside a 5 s drain

    assert shutdown.hand_back(stopping, drain_seconds=5) == 0

    assert {(row.status, row.attempts) for row in rows(batch_id)} == {("completed", 1)}
    assert wakes.sent == []  # nothing went back, so nobody needs waking


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def ready(port: int) -> int | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/ready", timeout=2) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as error:
        return error.code
    except OSError:
        return None


def test_sigterm_on_a_celery_gpu_worker_hands_its_held_requests_back_at_once(backend: Backend, tmp_path: Path) -> None:
    if backend.name != "postgres":
        pytest.skip("the Celery deployment runs on Postgres + Redis")
    redis.Redis.from_url(REDIS_URL).flushdb()
    batch_id, _ = submit_job([chat(i, max_tokens=5000) for i in range(6)])  # ~100 s each: still running at SIGTERM
    port, log = free_port(), tmp_path / "gpu.log"
    env = {
        **os.environ,
        **backend.env,
        "BACKFILL_REDIS_URL": REDIS_URL,
        "BACKFILL_METRICS_PORT": str(port),
        "BACKFILL_SHUTDOWN_DRAIN_SECONDS": "0",
    }
    gpu = start_worker(["--role", "gpu"], env=env, log=log)
    try:
        deadline = time.monotonic() + 60
        while ready(port) != 200:  # the probe turns ready once the engine is warm and Celery consumes
            assert gpu.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.2)
        CeleryWaker(REDIS_URL).send("batch.run", {"model": "fake-model"})
        while {row.status for row in rows(batch_id)} != {"running"}:
            assert gpu.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.1)
        stopped_at = time.monotonic()
        gpu.send_signal(signal.SIGTERM)
        gpu.wait(30)  # well inside run_task_seconds (300): the running task stops feeding at once
        took = time.monotonic() - stopped_at
    finally:
        if gpu.poll() is None:
            os.killpg(gpu.pid, signal.SIGKILL)
            gpu.wait(30)
    assert took < 15, log.read_text()[-3000:]
    back = rows(batch_id)
    assert {(row.status, row.attempts, row.lease_owner) for row in back} == {("queued", 0, None)}, log.read_text()
    assert "6 in-flight requests handed back" in log.read_text()
