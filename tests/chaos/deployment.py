"""The real Backfill processes as a Celery deployment: API, io worker, GPU worker(s) and beat.

Everything is configured by `BACKFILL_*` environment variables, as in production (infra/.env.example);
each run gets its own database, Redis database and bucket on the shared chaos cluster.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import httpx

from tests.chaos.procs import Child, free_port
from tests.chaos.services import AWS_ENV, Cluster
from tests.chaos.workload import PRICE_BOOK

ROOT = Path(__file__).resolve().parents[2]
MODEL = "chaos-model"
EngineKind = Literal["fake", "vllm"]
# The log line after which each kind of process is in service (a GPU worker: once its engine is loaded).
READY_MARKERS = {
    "api": "Application startup complete.",
    "io": " ready.",
    "gpu": " ready.",
    "beat": "beat: Starting...",
}


@dataclass(frozen=True)
class Timing:
    """Short leases and reaper passes, so recovery happens within a run (production: 120 s, 15 s, 300 s)."""

    lease_seconds: int = 5
    reap_interval_seconds: int = 1
    run_task_seconds: int = 5
    step_seconds: float = 0.04  # the fake engine's time per decode step
    worker_stale_seconds: int = 15  # a killed worker's row is stale, and its leases released, after this
    # Generation checkpoints (issue 21): periodic ones inside the fake's short generations (4-24 tokens at
    # 25 a second), and a SIGTERM'd GPU worker that hands back at once (no drain), so a hand-back really
    # interrupts generations; the grace is what the harness waits for it to exit before a kill -9.
    checkpoint_every_tokens: int = 4
    checkpoint_interval_seconds: float = 1.0
    shutdown_drain_seconds: int = 0
    shutdown_grace_seconds: int = 15

    def checkpoint_bound_tokens(self) -> int:
        """The stated crash bound (docs/workers.md): what one request loses to a kill -9 at most, in tokens.

        Fewer than `checkpoint_every_tokens` since the last periodic checkpoint, plus what it decodes between two
        of them: the interval, rounded up to the runner's lease renewals (which check it), plus 1 s for the
        write to commit. The fake decodes one token per step, so at most 1 / step_seconds a second.
        """
        from worker.feed.runner import RENEW_SECONDS

        seconds = self.checkpoint_interval_seconds + RENEW_SECONDS + 1.0
        return self.checkpoint_every_tokens + math.ceil(seconds / self.step_seconds)


def backfill_env(
    cluster: Cluster,
    *,
    database: str,
    redis_db: int,
    bucket: str,
    data_dir: Path,
    engine: EngineKind,
    timing: Timing,
    demo_model_cache: Path,
    ledger_dir: Path | None = None,
    lora: dict[str, object] | None = None,
) -> dict[str, str]:
    """The BACKFILL_* settings every process of one run shares; `lora`: the model's adapter settings
    (tests/chaos/adapters.py)."""
    spec = model_spec(engine, demo_model_cache=demo_model_cache, timing=timing, ledger_dir=ledger_dir)
    spec.update(lora or {})
    return {
        "BACKFILL_DATABASE_URL": cluster.postgres.url(database),
        "BACKFILL_REDIS_URL": cluster.redis.url(redis_db),
        "BACKFILL_S3_ENDPOINT_URL": cluster.s3.endpoint,
        "BACKFILL_S3_BUCKET": bucket,
        "BACKFILL_DATA_DIR": str(data_dir),
        "BACKFILL_MODELS": json.dumps({MODEL: spec}),
        "BACKFILL_LEASE_SECONDS": str(timing.lease_seconds),
        "BACKFILL_REAP_INTERVAL_SECONDS": str(timing.reap_interval_seconds),
        "BACKFILL_RUN_TASK_SECONDS": str(timing.run_task_seconds),
        "BACKFILL_WORKER_STALE_SECONDS": str(timing.worker_stale_seconds),
        "BACKFILL_CHECKPOINT_EVERY_TOKENS": str(timing.checkpoint_every_tokens),
        "BACKFILL_CHECKPOINT_INTERVAL_SECONDS": str(timing.checkpoint_interval_seconds),
        "BACKFILL_SHUTDOWN_DRAIN_SECONDS": str(timing.shutdown_drain_seconds),
        "BACKFILL_SHUTDOWN_GRACE_SECONDS": str(timing.shutdown_grace_seconds),
        "BACKFILL_BROKER_VISIBILITY_TIMEOUT_SECONDS": "60",
        "BACKFILL_ADMISSION_POLICY": "off",
        # Batch control (issue 20): readable spend figures (an output token bills $1, input is free) and room
        # for the workload's priority changes.
        "BACKFILL_PRICE_BOOK": json.dumps(PRICE_BOOK),
        "BACKFILL_TENANT_MAX_PRIORITY": "50",
        **AWS_ENV,
    }


def model_spec(
    engine: EngineKind, *, demo_model_cache: Path, timing: Timing, ledger_dir: Path | None = None
) -> dict[str, object]:
    """The registry entry: the fake engine (seconds per run) or the real vLLM on the demo model; the fake keeps
    a decode ledger in `ledger_dir` (worker/engine/decode_ledger.py) when given one."""
    if engine == "fake":
        extra: dict[str, object] = {"step_seconds": timing.step_seconds}
        if ledger_dir is not None:
            extra["decode_ledger_dir"] = str(ledger_dir)
        return {"path": "fake:chaos", "max_num_seqs": 8, "max_model_len": 512, "extra": extra}
    path = demo_model(demo_model_cache)
    return {"path": str(path), "max_num_seqs": 8, "max_model_len": 512, "dtype": "float32"}


def demo_model(cache: Path) -> Path:
    """The tiny demo model, built once per cluster with `backfill demo-model`."""
    path = cache / "models" / "backfill-demo"
    if not (path / "config.json").exists():
        cli("demo-model", str(path), env={}, timeout=300)
    return path


def vllm_env(cache: Path) -> dict[str, str]:
    """vLLM's sockets and compile caches inside the harness's directories, not /tmp and ~/.cache."""
    env = {"VLLM_NO_USAGE_STATS": "1", "VLLM_CPU_KVCACHE_SPACE": "1", "TOKENIZERS_PARALLELISM": "false"}
    for name, sub in (("TMPDIR", "tmp"), ("VLLM_CACHE_ROOT", "vllm"), ("TORCHINDUCTOR_CACHE_DIR", "inductor")):
        (cache / sub).mkdir(parents=True, exist_ok=True)
        env[name] = str(cache / sub)
    return env


def process_env(env: dict[str, str]) -> dict[str, str]:
    """The harness's environment without its own BACKFILL_* settings, plus the run's."""
    base = {name: value for name, value in os.environ.items() if not name.startswith("BACKFILL_")}
    base["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), base.get("PYTHONPATH")]))
    return {**base, **env}


def cli(*args: str, env: dict[str, str], timeout: float = 60) -> str:
    """Run one `backfill` command to completion and return its output."""
    result = subprocess.run(
        [sys.executable, "-m", "worker.cli", *args],
        env=process_env(env),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        start_new_session=True,
    )
    if result.returncode != 0:
        raise RuntimeError(f"backfill {' '.join(args)} failed: {result.stdout[-2000:]}{result.stderr[-2000:]}")
    return result.stdout


def create_keys(tenants: list[str], *, env: dict[str, str], admin: str | None = None) -> dict[str, str]:
    """One API key per tenant through `backfill keys create` (run side by side; the key is the last line);
    `admin`: also an admin key, for that tenant name."""
    commands = {tenant: ["--tenant", tenant] for tenant in tenants}
    if admin is not None:
        commands[admin] = ["--tenant", admin, "--admin"]
    procs = {
        tenant: subprocess.Popen(
            [sys.executable, "-m", "worker.cli", "keys", "create", *args],
            env=process_env(env),
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        for tenant, args in commands.items()
    }
    keys = {}
    for tenant, proc in procs.items():
        out, err = proc.communicate(timeout=60)
        if proc.returncode != 0:
            raise RuntimeError(f"keys create --tenant {tenant} failed: {err[-2000:]}")
        keys[tenant] = out.strip().splitlines()[-1]
    return keys


@dataclass
class Deployment:
    """Named Backfill processes that can be killed -9 and restarted one by one."""

    env: dict[str, str]
    logs: Path
    gpu_workers: int = 1
    api_port: int = field(default_factory=free_port)
    children: dict[str, Child] = field(default_factory=dict)

    def __post_init__(self) -> None:
        commands = {
            "api": ["serve", "--port", str(self.api_port)],
            "io": ["worker", "--role", "io"],
            "beat": ["beat"],
            **{f"gpu{n}": ["worker", "--role", "gpu"] for n in range(1, self.gpu_workers + 1)},
        }
        for name, args in commands.items():
            self.children[name] = Child(
                name,
                [sys.executable, "-m", "worker.cli", *args],
                process_env(self.env),
                self.logs,
                cwd=ROOT,
                ready_marker=READY_MARKERS[name.rstrip("0123456789")],
            )

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.api_port}"

    def start(self, *, timeout: float = 300) -> None:
        """Start every process and wait until each is in service (the GPU workers' engines loaded)."""
        for child in self.children.values():
            child.start()
        deadline = time.monotonic() + timeout
        for child in self.children.values():
            while not child.ready():
                if not child.alive():
                    raise RuntimeError(f"{child.name} exited at start: {child.tail()}")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{child.name} not ready after {timeout} s: {child.tail()}")
                time.sleep(0.1)
        self.wait_healthy(timeout=30)

    def wait_healthy(self, *, timeout: float) -> None:
        """Wait for the API's /health (it needs Postgres); raise with the log if it died."""
        api = self.children["api"]
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not api.alive():
                raise RuntimeError(f"the API exited: {api.tail()}")
            try:
                if httpx.get(f"{self.base_url}/health", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"the API is not healthy after {timeout} s: {api.tail()}")

    def kill(self, name: str) -> None:
        self.children[name].kill()

    def terminate(self, name: str, *, timeout: float) -> int | None:
        """SIGTERM one process and wait for it to exit (a GPU worker hands its work back first)."""
        return self.children[name].terminate(timeout=timeout)

    def restart(self, name: str) -> None:
        self.children[name].start()

    def stop(self) -> None:
        for child in self.children.values():
            child.kill()

    def gpu_names(self) -> list[str]:
        return [name for name in self.children if name.startswith("gpu")]
