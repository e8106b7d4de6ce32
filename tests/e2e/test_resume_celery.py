"""The Celery deployment on the real engine: SIGTERM to the GPU worker mid-decode hands its in-flight work back
with checkpoints, and a new GPU worker resumes them token-exact (issue 21, item 4)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from tests.conftest import Backend, LiveServer, configure, free_port, make_key, start_server
from tests.e2e.resume import (
    CHECKPOINT_ENV,
    MAX_TOKENS,
    answers,
    greedy_lines,
    rows_of,
    wait_until_checkpointed_mid_decode,
)
from tests.e2e.test_celery_worker import spawn
from tests.e2e.test_metrics_deployment import wait_until_scrapable
from tests.integration.api.helpers import read_lines, to_jsonl, upload, wait_for
from tests.scrape import scrape, value

pytestmark = pytest.mark.vllm

# Its own Redis database: test files run side by side, and a deployment sharing another test's database would
# flush and consume that test's messages.
REDIS_URL = "redis://127.0.0.1:6379/12"


class Deployment:
    """io worker, beat and GPU workers as subprocesses; the API in this process."""

    def __init__(self, env: dict[str, str], logs: Path) -> None:
        self.env, self.logs = env, logs
        self.procs = [spawn(["worker", "--role", "io"], env, logs / "io.log"), spawn(["beat"], env, logs / "beat.log")]

    def gpu_worker(self, name: str) -> tuple[subprocess.Popen[bytes], str]:
        """A GPU worker and its /metrics URL."""
        port = free_port()
        proc = spawn(["worker", "--role", "gpu", "--metrics-port", str(port)], self.env, self.logs / f"{name}.log")
        self.procs.append(proc)
        return proc, f"http://127.0.0.1:{port}/metrics"

    def tail(self, name: str) -> str:
        return (self.logs / f"{name}.log").read_text(errors="replace")[-4000:]

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)


@pytest.fixture
def deployment(
    backend: Backend, demo_model_path: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> Iterator[tuple[LiveServer, Deployment]]:
    redis.Redis.from_url(REDIS_URL).flushdb()
    models = {"backfill-demo": {"path": str(demo_model_path), "max_num_seqs": 4, "dtype": "float32"}}
    env = {
        **backend.env,
        "BACKFILL_REDIS_URL": REDIS_URL,
        "BACKFILL_MODELS": json.dumps(models),
        "BACKFILL_REAP_INTERVAL_SECONDS": "1",
        "BACKFILL_RUN_TASK_SECONDS": "5",
        "BACKFILL_SHUTDOWN_DRAIN_SECONDS": "0",  # hand everything in flight back at once, with its checkpoint
        **CHECKPOINT_ENV,
    }
    configure(monkeypatch, env)
    processes = Deployment(env, tmp_path)
    server, stop = start_server(with_worker=False)
    try:
        yield server, processes
    finally:
        stop()
        processes.stop()


@pytest.mark.parametrize("backend", ["postgres"], indirect=True)  # Postgres + Redis + moto S3
def test_sigterm_to_the_gpu_worker_mid_decode_checkpoints_and_a_new_worker_answers_as_if_uninterrupted(
    deployment: tuple[LiveServer, Deployment],
) -> None:
    server, processes = deployment
    client = server.client(make_key("acme"))
    first, _ = processes.gpu_worker("gpu1")
    lines = greedy_lines("c")
    batch = client.batches.create(
        input_file_id=upload(client, to_jsonl(lines)).id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    wait_until_checkpointed_mid_decode(batch.id, alive=lambda: first.poll() is None)

    first.send_signal(signal.SIGTERM)  # Celery's warm shutdown: the running task returns, then the hand-back
    assert first.wait(120) == 0, processes.tail("gpu1")
    stopped = rows_of(batch.id)
    assert {status for status, _ in stopped.values()} <= {"queued", "completed"}  # nothing left leased
    checkpointed = {cid: tokens for cid, (status, tokens) in stopped.items() if status == "queued" and tokens}
    assert checkpointed and all(tokens < MAX_TOKENS for tokens in checkpointed.values()), stopped

    _, metrics = processes.gpu_worker("gpu2")
    done = wait_for(client, batch.id, timeout=300)
    assert done.status == "completed", processes.tail("gpu2")
    outputs, errors = read_lines(client, done.output_file_id), read_lines(client, done.error_file_id)
    assert errors == []
    assert sorted(line["custom_id"] for line in outputs) == sorted(line["custom_id"] for line in lines)

    reference_batch = client.batches.create(
        input_file_id=upload(client, to_jsonl(lines)).id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    reference = wait_for(client, reference_batch.id, timeout=300)
    assert reference.status == "completed"
    expected = answers(read_lines(client, reference.output_file_id))
    assert {usage["usage"]["completion_tokens"] for usage in expected.values()} == {MAX_TOKENS}
    assert answers(outputs) == expected

    wait_until_scrapable(metrics)
    samples, _ = scrape(metrics)  # the worker that resumed them
    assert value(samples, "backfill_decode_tokens_resumed_total", model="backfill-demo") == sum(checkpointed.values())
    assert value(samples, "backfill_decode_tokens_discarded_total", model="backfill-demo") == 0
