"""The embedded default on the real engine: SIGTERM to `backfill serve` mid-decode checkpoints its in-flight
generations, and the next start resumes them token-exact (issue 21, items 4 and 6)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import Backend, configure, free_port, make_key
from tests.e2e.resume import (
    CHECKPOINT_ENV,
    MAX_TOKENS,
    answers,
    greedy_lines,
    rows_of,
    wait_until_checkpointed_mid_decode,
)
from tests.e2e.test_celery_worker import spawn
from tests.integration.api.helpers import read_lines, to_jsonl, upload, wait_for
from tests.scrape import scrape, value

pytestmark = pytest.mark.vllm


class Serve:
    """`backfill serve` as a subprocess, started again on the same data dir after each stop."""

    def __init__(self, env: dict[str, str], logs: Path) -> None:
        self.env, self.logs = env, logs
        self.proc: subprocess.Popen[bytes] | None = None
        self.base_url = ""

    def start(self, *, timeout: float = 300) -> None:
        port = free_port()
        self.base_url = f"http://127.0.0.1:{port}"
        self.proc = spawn(["serve", "--port", str(port)], self.env, self.logs)
        deadline = time.monotonic() + timeout
        while self.worker_state() != "ready":  # the API answers while the engine still loads
            assert self.alive(), self.tail()
            assert time.monotonic() < deadline, self.tail()
            time.sleep(0.2)

    def worker_state(self) -> str | None:
        try:
            response = httpx.get(f"{self.base_url}/health", timeout=2)
        except httpx.HTTPError:
            return None
        return str(response.json().get("worker")) if response.status_code == 200 else None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def tail(self) -> str:
        return self.logs.read_text(errors="replace")[-4000:]

    def terminate(self) -> int:
        """SIGTERM, as a service manager stops it; the exit code."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(120)

    def kill(self) -> None:
        if self.alive():
            assert self.proc is not None
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(30)

    def client(self, key: str):  # type: ignore[no-untyped-def]
        import openai

        return openai.OpenAI(api_key=key, base_url=f"{self.base_url}/v1", max_retries=0, timeout=60)


@pytest.fixture
def serve(backend: Backend, demo_model_path: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Serve]:
    models = {"backfill-demo": {"path": str(demo_model_path), "max_num_seqs": 4, "dtype": "float32"}}
    env = {**backend.env, "BACKFILL_MODELS": json.dumps(models), "BACKFILL_METRICS_CACHE_SECONDS": "0"}
    env.update(CHECKPOINT_ENV)
    configure(monkeypatch, env)
    server = Serve(env, tmp_path / "serve.log")
    yield server
    server.kill()


@pytest.mark.parametrize("backend", ["embedded"], indirect=True)  # SQLite, a local folder, the worker in serve
def test_sigterm_to_serve_mid_decode_checkpoints_and_the_next_start_answers_as_if_uninterrupted(serve: Serve) -> None:
    key = make_key("acme")
    serve.start()
    client = serve.client(key)
    lines = greedy_lines("r")
    batch = client.batches.create(
        input_file_id=upload(client, to_jsonl(lines)).id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    wait_until_checkpointed_mid_decode(batch.id, alive=serve.alive)

    assert serve.terminate() == 0, serve.tail()
    stopped = rows_of(batch.id)
    assert {status for status, _ in stopped.values()} <= {"queued", "completed"}  # nothing left leased
    checkpointed = {cid: tokens for cid, (status, tokens) in stopped.items() if status == "queued" and tokens}
    assert checkpointed and all(tokens < MAX_TOKENS for tokens in checkpointed.values()), stopped

    serve.start()  # the same data dir: the queue, the checkpoints
    client = serve.client(key)
    done = wait_for(client, batch.id, timeout=300)
    assert done.status == "completed", serve.tail()
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

    samples, _ = scrape(f"{serve.base_url}/metrics")  # the process that resumed them
    assert value(samples, "backfill_decode_tokens_resumed_total", model="backfill-demo") == sum(checkpointed.values())
    assert value(samples, "backfill_decode_tokens_discarded_total", model="backfill-demo") == 0
