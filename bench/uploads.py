"""Uploads benchmark: an 8 GB JSONL file through the official SDK's `client.uploads.upload_file_chunked` (64 MB
parts) into a completed batch, on Postgres with the local-folder store or S3, the API and the ingest in their own
processes (`backfill serve`, `backfill worker --role io`, a `--role gpu` worker on the fake engine, over Redis).

Prints the upload's time and throughput, the ingest's (validate + enqueue: one streamed read of the file), the
run to `completed`, and the peak RSS of the API process (sampled every 50 ms) and of the io worker that ingests.
S3 is s3rver (npm, installed under bench/out/s3rver on first use): it streams parts to disk and joins them with
streams; moto's server joins a multipart upload in memory (8 GB of RAM twice over), so it cannot hold this file.
The default suite runs the same path on a few MB (tests/integration/api/openai/test_uploads.py). Usage:
    .venv/bin/python bench/uploads.py --store local|s3 [--gib 8] [--part-mib 64] [--line-kib 160] [--keep-source]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import openai
import psutil
import sqlalchemy as sa

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "out"
PG_ADMIN = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
S3RVER = "s3rver@3.7.1"
MODELS = {"fake-model": {"path": "fake:", "max_num_seqs": 256, "max_model_len": 10**9, "extra": {"step_seconds": 0.0}}}


class PeakRss:
    """The largest RSS of a process (and, with `tree`, of the biggest one of its children) every 50 ms."""

    def __init__(self, pid: int) -> None:
        self.proc = psutil.Process(pid)
        self.peak = 0
        self.stop = threading.Event()
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        while not self.stop.is_set():
            try:
                procs = [self.proc, *self.proc.children(recursive=True)]
                self.peak = max(self.peak, *(p.memory_info().rss for p in procs))
            except psutil.Error:
                pass
            time.sleep(0.05)

    def reset(self) -> int:
        peak, self.peak = self.peak, 0
        return peak


def make_file(path: Path, size: int, line_bytes: int) -> int:
    """At most `size` bytes of batch lines of about `line_bytes` each (kept between runs of the same size)."""
    if path.exists() and 0 <= size - path.stat().st_size < line_bytes:
        return sum(1 for _ in path.open("rb"))
    filler = "x" * max(0, line_bytes - 200)
    lines = written = 0
    with path.open("wb") as handle:
        while True:
            body = {
                "model": "fake-model",
                "messages": [{"role": "user", "content": f"{lines} {filler}"}],
                "max_tokens": 1,
            }
            line = json.dumps({"custom_id": f"r{lines}", "method": "POST", "url": "/v1/chat/completions", "body": body})
            if written + len(line) + 1 > size:  # never past `size`: 8 GiB is the Uploads limit itself
                return lines
            handle.write(line.encode() + b"\n")
            written += len(line) + 1
            lines += 1


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def start_s3rver(directory: Path) -> tuple[str, subprocess.Popen[bytes]]:
    """s3rver on a free port, its data under `directory`, bucket `bench` (installed with npm on first use)."""
    prefix = OUT / "s3rver"
    binary = prefix / "node_modules" / ".bin" / "s3rver"
    if not binary.exists():
        subprocess.run(["npm", "install", "--no-audit", "--no-fund", "--prefix", str(prefix), S3RVER], check=True)
    port = free_port()
    directory.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen(
        [str(binary), "-d", str(directory), "-a", "127.0.0.1", "-p", str(port), "-s", "--configure-bucket", "bench"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    for _ in range(100):
        try:
            httpx.get(f"http://127.0.0.1:{port}/", timeout=1)
            break
        except httpx.HTTPError:
            time.sleep(0.1)
    return f"http://127.0.0.1:{port}", proc


def wait_health(port: int) -> None:
    for _ in range(300):
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise RuntimeError("the API did not start")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--store", choices=("local", "s3"), required=True)
    parser.add_argument("--gib", type=float, default=8.0, help="the file's size in GiB")
    parser.add_argument("--part-mib", type=int, default=64, help="the SDK's part size (OpenAI's 64 MB by default)")
    parser.add_argument("--line-kib", type=int, default=160, help="bytes per line: 8 GiB in ~52,000 lines")
    parser.add_argument("--keep-source", action="store_true", help="keep the generated file for the next run")
    parser.add_argument("--out-name", default=None, help="results go to bench/out/NAME.json")
    args = parser.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    size = int(args.gib * 1024**3)
    source = OUT / "uploads-source.jsonl"
    started = time.perf_counter()
    lines = make_file(source, size, args.line_kib * 1024)
    size = source.stat().st_size
    print(f"source: {size / 1e9:.2f} GB, {lines} lines ({time.perf_counter() - started:.0f} s)", flush=True)

    work = OUT / f"uploads-{args.store}-{uuid.uuid4().hex[:6]}"
    dbname = f"backfill_bench_{uuid.uuid4().hex[:8]}"
    admin = sa.create_engine(PG_ADMIN, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(sa.text(f'CREATE DATABASE "{dbname}"'))
    env = {
        **os.environ,
        "BACKFILL_DATABASE_URL": f"postgresql://postgres@127.0.0.1:5432/{dbname}",
        "BACKFILL_REDIS_URL": "redis://127.0.0.1:6379/13",
        "BACKFILL_DATA_DIR": str(work),
        "BACKFILL_MODELS": json.dumps(MODELS),
        "BACKFILL_LOG_LEVEL": "WARNING",
        "BACKFILL_METRICS_PORT": "0",
        "BACKFILL_BATCH_MAX_REQUESTS": str(max(50_000, lines)),
        "BACKFILL_TENANT_MAX_CONCURRENT_REQUESTS": "0",
        "MALLOC_ARENA_MAX": "2",  # as infra/Dockerfile runs every Backfill process
    }
    procs: list[subprocess.Popen[bytes]] = []
    if args.store == "s3":
        endpoint, s3 = start_s3rver(work / "s3")
        procs.append(s3)
        env |= {
            "BACKFILL_S3_ENDPOINT_URL": endpoint,
            "BACKFILL_S3_BUCKET": "bench",
            "AWS_ACCESS_KEY_ID": "S3RVER",
            "AWS_SECRET_ACCESS_KEY": "S3RVER",
            "AWS_DEFAULT_REGION": "us-east-1",
        }
    backfill = [sys.executable, "-m", "worker.cli"]
    try:
        subprocess.run([*backfill, "migrate"], env=env, check=True, cwd=ROOT, capture_output=True)
        created = subprocess.run(
            [*backfill, "keys", "create", "--tenant", "bench"],
            env=env,
            check=True,
            cwd=ROOT,
            capture_output=True,
            text=True,
        )
        key = created.stdout.strip().splitlines()[-1]
        port = free_port()
        quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL, "cwd": ROOT, "env": env}
        api = subprocess.Popen([*backfill, "serve", "--port", str(port)], **quiet)  # type: ignore[call-overload]
        io = subprocess.Popen([*backfill, "worker", "--role", "io"], **quiet)  # type: ignore[call-overload]
        gpu = subprocess.Popen([*backfill, "worker", "--role", "gpu", "--model", "fake-model"], **quiet)  # type: ignore[call-overload]
        procs += [api, io, gpu]
        wait_health(port)
        time.sleep(3)  # the workers connect to Redis
        api_rss, io_rss = PeakRss(api.pid), PeakRss(io.pid)
        baseline = {
            "api_mb": psutil.Process(api.pid).memory_info().rss / 2**20,
            "io_mb": psutil.Process(io.pid).memory_info().rss / 2**20,
        }
        client = openai.OpenAI(api_key=key, base_url=f"http://127.0.0.1:{port}/v1", timeout=3600, max_retries=0)

        started = time.perf_counter()
        upload = client.uploads.upload_file_chunked(
            file=source, mime_type="application/jsonl", purpose="batch", part_size=args.part_mib * 1024**2
        )
        upload_seconds = time.perf_counter() - started
        assert upload.status == "completed" and upload.file is not None, upload
        upload_peak = api_rss.reset()
        io_rss.reset()

        started = time.perf_counter()
        batch = client.batches.create(
            input_file_id=upload.file.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        while (batch := client.batches.retrieve(batch.id)).status == "validating":
            time.sleep(0.2)
        ingest_seconds = time.perf_counter() - started
        ingest_peak = io_rss.peak
        while (batch := client.batches.retrieve(batch.id)).status not in {
            "completed",
            "failed",
            "expired",
            "cancelled",
        }:
            time.sleep(0.5)
        done_seconds = time.perf_counter() - started
        api_rss.stop.set()
        io_rss.stop.set()
        result: dict[str, Any] = {
            "store": "s3 (s3rver)" if args.store == "s3" else "local folder",
            "file_gb": round(size / 1e9, 2),
            "file_gib": round(size / 1024**3, 2),
            "lines": lines,
            "part_mib": args.part_mib,
            "parts": -(-size // (args.part_mib * 1024**2)),
            "upload_seconds": round(upload_seconds, 1),
            "upload_mb_per_s": round(size / 1e6 / upload_seconds, 1),
            "api_rss_baseline_mb": round(baseline["api_mb"]),
            "api_peak_rss_mb_upload": round(upload_peak / 2**20),
            "ingest_seconds": round(ingest_seconds, 1),
            "ingest_mb_per_s": round(size / 1e6 / ingest_seconds, 1),
            "io_worker_rss_baseline_mb": round(baseline["io_mb"]),
            "io_worker_peak_rss_mb_ingest": round(ingest_peak / 2**20),
            "io_worker_peak_rss_mb_run_and_finalize": round(io_rss.peak / 2**20),
            "api_peak_rss_mb_after_upload": round(api_rss.peak / 2**20),
            "batch_status": batch.status,
            "batch_completed": batch.request_counts.completed if batch.request_counts else None,
            "create_to_completed_seconds": round(done_seconds, 1),
        }
        print(json.dumps(result, indent=2))
        name = args.out_name or f"uploads-{args.store}"
        (OUT / f"{name}.json").write_text(json.dumps({"result": result}, indent=2))
    finally:
        for proc in reversed(procs):
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
        with admin.connect() as conn:
            conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)'))
        shutil.rmtree(work, ignore_errors=True)
        if not args.keep_source:
            source.unlink(missing_ok=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
