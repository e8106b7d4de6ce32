"""Postgres + Redis + moto S3 with separate Celery processes; kill -9 of the GPU worker loses nothing."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from tests.conftest import Backend, LiveServer, configure, make_key, start_server
from tests.integration.api.helpers import read_lines, to_jsonl, upload, wait_for

pytestmark = pytest.mark.vllm

REDIS_URL = "redis://127.0.0.1:6379/7"


@pytest.fixture
def celery_env(
    backend: Backend, demo_model_path: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> dict[str, str]:
    if backend.name != "postgres":
        pytest.skip("the Celery deployment runs on Postgres + Redis + S3")
    redis.Redis.from_url(REDIS_URL).flushdb()
    env = {
        **backend.env,
        "BACKFILL_REDIS_URL": REDIS_URL,
        "BACKFILL_MODELS": json.dumps(
            {"backfill-demo": {"path": str(demo_model_path), "max_num_seqs": 8, "dtype": "float32"}}
        ),
        "BACKFILL_LEASE_SECONDS": "5",
        "BACKFILL_REAP_INTERVAL_SECONDS": "1",
        "BACKFILL_RUN_TASK_SECONDS": "5",
    }
    configure(monkeypatch, env)
    return env


def spawn(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    full = {**os.environ, **env, "VLLM_NO_USAGE_STATS": "1"}
    return subprocess.Popen(
        [sys.executable, "-m", "worker.cli", *args],
        env=full,
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
        cwd=Path(__file__).resolve().parents[2],
        start_new_session=True,
    )


@pytest.fixture
def deployment(celery_env: dict[str, str], tmp_path: Path) -> Iterator[tuple[LiveServer, dict[str, object]]]:
    procs: dict[str, object] = {
        "io": spawn(["worker", "--role", "io"], celery_env, tmp_path / "io.log"),
        "beat": spawn(["beat"], celery_env, tmp_path / "beat.log"),
        "gpu": spawn(["worker", "--role", "gpu"], celery_env, tmp_path / "gpu.log"),
        "env": celery_env,
        "tmp": tmp_path,
    }
    server, stop = start_server(with_worker=False)
    yield server, procs
    stop()
    for name in ("io", "beat", "gpu"):
        proc = procs[name]
        assert isinstance(proc, subprocess.Popen)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)


def test_kill_9_of_the_gpu_worker_mid_batch_loses_and_duplicates_nothing(
    deployment: tuple[LiveServer, dict[str, object]],
) -> None:
    server, procs = deployment
    client = server.client(make_key("acme"))
    lines = [
        {
            "custom_id": f"k{i}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {
                "model": "backfill-demo",
                "messages": [{"role": "user", "content": f"x{i}"}],
                "max_tokens": 48,
                "ignore_eos": True,
            },
        }
        for i in range(120)
    ]
    source = upload(client, to_jsonl(lines))
    batch = client.batches.create(input_file_id=source.id, endpoint="/v1/chat/completions", completion_window="24h")
    deadline = time.time() + 240
    while client.batches.retrieve(batch.id).request_counts.completed < 10:
        assert time.time() < deadline, (Path(str(procs["tmp"])) / "gpu.log").read_text()[-3000:]
        time.sleep(0.2)
    gpu = procs["gpu"]
    assert isinstance(gpu, subprocess.Popen)
    os.killpg(gpu.pid, signal.SIGKILL)
    gpu.wait(30)
    partial = client.batches.retrieve(batch.id)
    assert partial.status == "in_progress" and partial.request_counts.completed < 120
    procs["gpu"] = spawn(["worker", "--role", "gpu"], procs["env"], Path(str(procs["tmp"])) / "gpu2.log")  # type: ignore[arg-type]
    done = wait_for(client, batch.id, timeout=300)
    assert done.status == "completed", done
    outputs, errors = read_lines(client, done.output_file_id), read_lines(client, done.error_file_id)
    ids = [line["custom_id"] for line in outputs + errors]
    assert sorted(ids) == sorted(f"k{i}" for i in range(120))
    assert errors == []
