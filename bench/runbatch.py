"""Backfill vs vLLM's own batch runner (`python -m vllm.entrypoints.openai.run_batch`, i.e. `vllm run-batch`).

1. One big job: a 5,000-line chat file. Engine start-up is counted for both sides: run-batch's clock runs
   from process start to exit; Backfill's from `backfill serve` start (embedded default: SQLite, local
   folder, in-process worker) through upload → batch → completed → output file downloaded.
2. Many small jobs: 20 jobs x 50 lines from 5 tenants submitted together to the (already running)
   Backfill server, first upload → last output downloaded; vs run-batch once per job, as a user without
   Backfill would run them one after another (each run pays engine start-up). By default run-batch runs
   `--runbatch-jobs` of the 20 jobs and the sequential total is that mean x 20 (the jobs are identical in
   size); `--runbatch-jobs 20` runs them all.

Both sides use the same model, the same requests and the same engine settings (max_num_seqs,
max_model_len, dtype float32, eager mode, KV cache size). Usage:
    .venv/bin/python bench/runbatch.py [--big 5000] [--jobs 20] [--per-job 50] [--tokens 32]
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import deque
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
import openai

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._setup import OUT, chat_line

ROOT = Path(__file__).resolve().parents[1]
MODEL = "backfill-demo"


def engine_env() -> dict[str, str]:
    env = dict(os.environ)
    for name, sub in (("TMPDIR", "tmp"), ("VLLM_CACHE_ROOT", "vllm-cache"), ("TORCHINDUCTOR_CACHE_DIR", "inductor")):
        (OUT / sub).mkdir(parents=True, exist_ok=True)
        env.setdefault(name, str(OUT / sub))
    env.update(VLLM_NO_USAGE_STATS="1", VLLM_CPU_KVCACHE_SPACE="1", VLLM_CPU_NUM_OF_RESERVED_CPU="0")
    return env


def write_jsonl(path: Path, lines: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def run_batch(
    model_dir: Path, source: Path, max_num_seqs: int, *, extra: Sequence[str] = (), env: dict[str, str] | None = None
) -> dict[str, Any]:
    """vLLM's own batch runner, as a user would start it; wall time from process start to exit.

    `work_seconds` runs from its log's "Reading batch from" (engine and endpoints up, about to submit the file's
    lines) to its "Writing outputs to" (every line answered; the file write that follows takes milliseconds):
    the rest of the wall, `startup_seconds` before and the engine's shut-down after, is not the batch. `extra`: more of its arguments; `env`: its
    environment (default `engine_env()`)."""
    target = source.with_suffix(".vllm-out.jsonl")
    command = [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.run_batch",
        "-i",
        str(source),
        "-o",
        str(target),
        "--model",
        str(model_dir),
        "--served-model-name",
        MODEL,
        "--max-num-seqs",
        str(max_num_seqs),
        "--max-model-len",
        "2048",
        "--dtype",
        "float32",
        "--enforce-eager",
        *extra,
    ]
    started = time.perf_counter()
    ready = written = None
    tail: deque[str] = deque(maxlen=60)
    with subprocess.Popen(
        command,
        env={**(env or engine_env()), "PYTHONUNBUFFERED": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,  # vLLM logs to stdout
        text=True,
        cwd=OUT,
    ) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            if ready is None and "Reading batch from" in line:
                ready = time.perf_counter() - started
            elif written is None and "Writing outputs to" in line:
                written = time.perf_counter() - started
            tail.append(line)
        returncode = proc.wait()
    seconds = time.perf_counter() - started
    if returncode != 0:
        raise RuntimeError("run_batch failed:\n" + "".join(tail)[-3000:])
    lines = [json.loads(line) for line in target.read_text().splitlines() if line.strip()]
    ok = sum(1 for line in lines if (line.get("response") or {}).get("status_code") == 200)
    work = written - ready if ready is not None and written is not None else None
    return {
        "seconds": seconds,
        "startup_seconds": ready,
        "work_seconds": work,
        "lines": len(lines),
        "ok": ok,
        "output": lines,
    }


class Server:
    """`backfill serve` in its own process (embedded default), with one API key per tenant."""

    def __init__(
        self,
        model_dir: Path,
        max_num_seqs: int,
        tenants: int,
        *,
        spec: dict[str, Any] | None = None,
        env: dict[str, str] | None = None,
        registry: dict[str, dict[str, Any]] | None = None,
    ) -> None:
        """`spec`: more of the model's registry entry (storage/registry.py); `env`: the server's environment
        (default `engine_env()`); `registry`: the whole BACKFILL_MODELS instead (several models)."""
        self.data = Path(tempfile.mkdtemp(prefix="runbatch-", dir=OUT))
        registry = registry or {
            MODEL: {
                "path": str(model_dir),
                "max_num_seqs": max_num_seqs,
                "max_model_len": 2048,
                "dtype": "float32",
                **(spec or {}),
            }
        }
        self.env = {
            **(env or engine_env()),
            "BACKFILL_DATA_DIR": str(self.data),
            "BACKFILL_MODELS": json.dumps(registry),
            "BACKFILL_LOG_LEVEL": "WARNING",
        }
        backfill = [sys.executable, "-m", "worker.cli"]
        subprocess.run([*backfill, "migrate"], env=self.env, check=True, cwd=ROOT, capture_output=True)
        self.keys = []
        for index in range(tenants):
            made = subprocess.run(
                [*backfill, "keys", "create", "--tenant", f"tenant-{index}"],
                env=self.env,
                check=True,
                cwd=ROOT,
                capture_output=True,
                text=True,
            )
            self.keys.append(made.stdout.strip().splitlines()[-1])
        self.port = 18500 + os.getpid() % 400
        self.started = time.perf_counter()
        self.proc = subprocess.Popen(
            [*backfill, "serve", "--port", str(self.port)],
            env=self.env,
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=(self.data / "serve.log").open("w"),
        )
        self.ready_seconds = self._wait_ready()

    def _wait_ready(self) -> float:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError((self.data / "serve.log").read_text()[-3000:])
            try:
                worker = httpx.get(f"http://127.0.0.1:{self.port}/health").json().get("worker")
                if worker == "ready":
                    return time.perf_counter() - self.started
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        raise TimeoutError("backfill serve did not become ready")

    def client(self, tenant: int = 0) -> openai.OpenAI:
        return openai.OpenAI(api_key=self.keys[tenant], base_url=f"http://127.0.0.1:{self.port}/v1", timeout=600)

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(60)


def run_job(
    client: openai.OpenAI,
    source: Path,
    *,
    poll_seconds: float = 0.1,
    endpoint: str = "/v1/chat/completions",
    long_poll: bool = False,
) -> dict[str, Any]:
    """Upload → batch → poll every `poll_seconds` (with `long_poll`, follow it as the CLI does: long-polls of up to
    `poll_seconds`, client/progress.py) → download the output file; return counts."""
    from client.progress import next_look

    with source.open("rb") as handle:
        uploaded = client.files.create(file=(source.name, handle), purpose="batch")
    batch = client.batches.create(input_file_id=uploaded.id, endpoint=endpoint, completion_window="24h")  # type: ignore[arg-type]
    waits = [True]
    while batch.status not in {"completed", "failed", "expired", "cancelled"}:
        if long_poll:
            batch = next_look(client, batch, seconds=poll_seconds, waits=waits)
            continue
        time.sleep(poll_seconds)
        batch = client.batches.retrieve(batch.id)
    lines = []
    if batch.output_file_id:
        lines = [json.loads(line) for line in client.files.content(batch.output_file_id).text.splitlines() if line]
    ok = sum(1 for line in lines if line["response"]["status_code"] == 200)
    usage = batch.usage.model_dump() if batch.usage else {}
    return {
        "status": batch.status,
        "lines": len(lines),
        "ok": ok,
        "custom_ids": [line["custom_id"] for line in lines],
        "usage": usage,
    }


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--big", type=int, default=5000)
    parser.add_argument("--jobs", type=int, default=20)
    parser.add_argument("--per-job", type=int, default=50)
    parser.add_argument("--tenants", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--max-num-seqs", type=int, default=64)
    parser.add_argument("--runbatch-jobs", type=int, default=3, help="how many of the small jobs run-batch runs")
    args = parser.parse_args()
    OUT.mkdir(exist_ok=True)
    from worker.engine.demo_model import build_demo_model

    model_dir = build_demo_model(OUT / "models" / "backfill-demo")
    work = Path(tempfile.mkdtemp(prefix="runbatch-files-", dir=OUT))
    big = write_jsonl(work / "big.jsonl", [chat_line(i, args.tokens) for i in range(args.big)])
    small = [
        write_jsonl(work / f"job{j}.jsonl", [chat_line(j * 1000 + i, args.tokens) for i in range(args.per_job)])
        for j in range(args.jobs)
    ]

    # 1. One big job, start-up counted on both sides; run-batch first (the cold page cache hits it, not us).
    vllm_big = run_batch(model_dir, big, args.max_num_seqs)
    print(json.dumps({"run_batch_big": {k: v for k, v in vllm_big.items() if k != "output"}}), flush=True)
    server = Server(model_dir, args.max_num_seqs, args.tenants)
    try:
        ours_big = run_job(server.client(0), big)
        big_seconds = time.perf_counter() - server.started
        print(json.dumps({"backfill_big_seconds": big_seconds, "ready_seconds": server.ready_seconds}), flush=True)

        # 2. Many small jobs from several tenants, submitted together to the warm server.
        started = time.perf_counter()
        with cf.ThreadPoolExecutor(max_workers=len(small)) as pool:
            futures = [pool.submit(run_job, server.client(j % args.tenants), path) for j, path in enumerate(small)]
            small_results = [future.result() for future in futures]
        small_seconds = time.perf_counter() - started
    finally:
        server.stop()
    sample = small[: max(1, min(args.runbatch_jobs, len(small)))]
    vllm_small = [run_batch(model_dir, path, args.max_num_seqs) for path in sample]
    per_job = sum(r["seconds"] for r in vllm_small) / len(vllm_small)
    vllm_small_total = per_job * len(small)

    expected_small = {f"r{j * 1000 + i}" for j in range(args.jobs) for i in range(args.per_job)}
    got_small = [cid for r in small_results for cid in r["custom_ids"]]
    result = {
        "engine_startup_counted": True,
        "big_lines": args.big,
        "output_tokens_each": args.tokens,
        "max_num_seqs": args.max_num_seqs,
        "backfill_ready_seconds": round(server.ready_seconds, 1),
        "backfill_big_seconds": round(big_seconds, 1),
        "run_batch_big_seconds": round(vllm_big["seconds"], 1),
        "big_wall_ratio": round(big_seconds / vllm_big["seconds"], 3),
        "big_all_ok": ours_big["ok"] == args.big and vllm_big["ok"] == args.big,
        "small_jobs": args.jobs,
        "small_lines_each": args.per_job,
        "tenants": args.tenants,
        "backfill_small_seconds": round(small_seconds, 1),
        "run_batch_jobs_measured": len(vllm_small),
        "run_batch_seconds_per_job": [round(r["seconds"], 1) for r in vllm_small],
        "run_batch_small_seconds_sequential": round(vllm_small_total, 1),
        "small_wall_ratio": round(small_seconds / vllm_small_total, 3),
        "small_all_ok": all(r["status"] == "completed" and r["ok"] == args.per_job for r in small_results)
        and sorted(got_small) == sorted(expected_small),
    }
    print(json.dumps(result, indent=2))
    (OUT / "runbatch.json").write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
