"""A GPU worker told to stop (SIGTERM: a pod deleted, a rollout, a drained node) hands its in-flight work back.

The rows go back to `queued` at once with their attempt not counted, so another worker of the model
claims them now instead of after the lease expires, and a worker stopped mid-request costs no attempt.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
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
from worker.engine.fake import FakeEngine
from worker.feed.runner import Runner
from worker.process import shutdown

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


def wait_until(
    done: Callable[[], bool], *, workers: list[subprocess.Popen[bytes]], logs: list[Path], seconds: float
) -> None:
    deadline = time.monotonic() + seconds
    while not done():
        alive = all(worker.poll() is None for worker in workers)
        assert alive and time.monotonic() < deadline, "\n".join(log.read_text()[-2000:] for log in logs)
        time.sleep(0.1)


def test_sigterm_on_a_celery_gpu_worker_hands_its_held_requests_to_another_worker_at_once(
    backend: Backend, tmp_path: Path
) -> None:
    if backend.name != "postgres":
        pytest.skip("the Celery deployment runs on Postgres + Redis")
    redis.Redis.from_url(REDIS_URL).flushdb()
    batch_id, _ = submit_job([chat(i, max_tokens=5000) for i in range(6)])  # ~100 s each on the stopping worker
    env = {**os.environ, **backend.env, "BACKFILL_REDIS_URL": REDIS_URL, "BACKFILL_SHUTDOWN_DRAIN_SECONDS": "0"}
    fast = {**FAKE, "extra": {"step_seconds": 0.0}}  # the other node finishes them in a moment
    ports, logs = [free_port(), free_port()], [tmp_path / "stopping.log", tmp_path / "other.log"]
    stopping = start_worker(["--role", "gpu"], env={**env, "BACKFILL_METRICS_PORT": str(ports[0])}, log=logs[0])
    workers = [stopping]
    try:
        # The probe turns ready once the engine is warm and Celery consumes.
        wait_until(lambda: ready(ports[0]) == 200, workers=workers, logs=logs, seconds=60)
        CeleryWaker(REDIS_URL).send("batch.run", {"model": "fake-model"})
        wait_until(
            lambda: {row.status for row in rows(batch_id)} == {"running"}, workers=workers, logs=logs, seconds=30
        )
        other_env = {**env, "BACKFILL_METRICS_PORT": str(ports[1]), "BACKFILL_MODELS": json.dumps({"fake-model": fast})}
        workers.append(start_worker(["--role", "gpu"], env=other_env, log=logs[1]))
        wait_until(lambda: ready(ports[1]) == 200, workers=workers, logs=logs, seconds=60)

        stopped_at = time.monotonic()
        stopping.send_signal(signal.SIGTERM)
        stopping.wait(30)  # well inside run_task_seconds (300): the running task stops feeding at once
        exited = time.monotonic() - stopped_at
        workers.remove(stopping)
        # No beat runs and the leases last 120 s: only the hand-back's wake-up can bring them over now.
        wait_until(
            lambda: {row.status for row in rows(batch_id)} == {"completed"}, workers=workers, logs=logs, seconds=30
        )
    finally:
        for worker in [stopping, *workers]:
            if worker.poll() is None:
                os.killpg(worker.pid, signal.SIGKILL)
                worker.wait(30)
    assert exited < 15 and "6 in-flight requests handed back" in logs[0].read_text()
    done = rows(batch_id)
    assert [row.attempts for row in done] == [1] * 6  # the interrupted first run did not count
    assert sorted(row.custom_id for row in done) == [f"r{i}" for i in range(6)]
