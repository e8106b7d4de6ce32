"""The Celery GPU worker with two models: it consumes both gpu.<model> queues and switches between them."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest
import redis

from storage.wakeups import CeleryWaker
from tests.conftest import Backend
from tests.integration.worker.feed.test_slot import FAKE, A, B, enqueue, outcome
from tests.integration.worker.processes import start_worker

REDIS_URL = "redis://127.0.0.1:6379/9"

pytestmark = pytest.mark.backfill_env(
    {
        "BACKFILL_MODELS": json.dumps({A: FAKE, B: FAKE}),
        "BACKFILL_SWITCH_CHECK_SECONDS": "1",
        "BACKFILL_RUN_TASK_SECONDS": "5",
    }
)


def test_a_celery_gpu_worker_serves_two_models_one_engine_at_a_time(backend: Backend, tmp_path: Path) -> None:
    if backend.name != "postgres":
        pytest.skip("the Celery deployment runs on Postgres + Redis")
    redis.Redis.from_url(REDIS_URL).flushdb()
    first = enqueue(A, 20, deadline_in=3600)
    second = enqueue(B, 20, deadline_in=7200)
    log = tmp_path / "gpu.log"
    env = {**os.environ, **backend.env, "BACKFILL_REDIS_URL": REDIS_URL}
    gpu = start_worker(["--role", "gpu", "--models", f"{A},{B}"], env=env, log=log)
    try:
        CeleryWaker(REDIS_URL).send("batch.run", {"model": B})  # one wake-up, for the model not loaded
        deadline = time.monotonic() + 60
        while outcome(second)[0] != {"completed": 20}:
            assert gpu.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.2)
    finally:
        os.killpg(gpu.pid, signal.SIGKILL)
        gpu.wait(30)
    text = log.read_text()
    assert f"gpu.{A}" in text and f"gpu.{B}" in text  # the worker consumes both models' queues
    assert f"model switch: (none) -> {A} [load]" in text  # warm start: A's deadline is nearest
    assert f"model switch: {A} -> {B} [drained]" in text
    assert outcome(first)[:2] == ({"completed": 20}, {1})
    assert outcome(second)[:2] == ({"completed": 20}, {1})
