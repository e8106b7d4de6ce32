"""Under Celery: the commit's wake-up sends `webhook.deliver` to the io worker, and beat's schedule retries."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import openai
import pytest
import redis

from tests.conftest import Backend
from tests.integration.api.conftest import FAKE_MODELS
from tests.integration.receiver import WEBHOOK_TEST_ENV, Reply, running_receiver
from tests.integration.worker.jobs.test_webhooks import delivery_rows, end_batch, register

REDIS_URL = "redis://127.0.0.1:6379/10"
ROOT = Path(__file__).resolve().parents[3]

pytestmark = pytest.mark.backfill_env(
    {
        "BACKFILL_MODELS": FAKE_MODELS,
        **WEBHOOK_TEST_ENV,
        "BACKFILL_REDIS_URL": REDIS_URL,
        "BACKFILL_WEBHOOK_POLL_SECONDS": "1",
    }
)


def spawn(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "worker.cli", *args],
        env={**os.environ, **env},
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
        cwd=ROOT,
        start_new_session=True,
    )


def test_the_io_worker_delivers_on_wake_up_and_beat_drives_the_retries(backend: Backend, tmp_path: Path) -> None:
    if backend.name != "postgres":
        pytest.skip("the Celery deployment runs on Postgres + Redis")
    redis.Redis.from_url(REDIS_URL).flushdb()
    log = tmp_path / "celery.log"
    with running_receiver() as receiver:
        receiver.script = [Reply(500, b"not yet")]
        _, secret = register(f"{receiver.url}/hook")
        io = spawn(["worker", "--role", "io"], backend.env, log)
        beat = spawn(["beat"], {**backend.env, "BACKFILL_DATA_DIR": str(tmp_path)}, log)
        try:
            time.sleep(3)  # let the worker subscribe before the wake-up goes out
            batch_id = end_batch()  # its commit sends `webhook.deliver` by name (CeleryWaker)
            posts = receiver.wait_for(2, timeout=60)  # the first attempt fails; beat's pass retries
            deadline = time.time() + 15
            while delivery_rows()[0].status != "delivered" and time.time() < deadline:
                time.sleep(0.2)
        finally:
            for process in (io, beat):
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(30)
    assert posts[0].headers["webhook-id"] == posts[1].headers["webhook-id"]
    event = openai.OpenAI(api_key="unused").webhooks.unwrap(posts[1].body, posts[1].headers, secret=secret)
    assert event.data.id == batch_id
    [row] = delivery_rows()
    assert row.status == "delivered" and row.attempts == 2, log.read_text()[-3000:]
    assert "webhook.deliver" in log.read_text()
