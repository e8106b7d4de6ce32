"""Anthropic create benchmark: the same requests as one `POST /v1/messages/batches` body vs an OpenAI file
upload + `POST /v1/batches`, through the real API (embedded, SQLite + a local folder, fake engine).

Prints, for each: seconds to the create answer, seconds until the batch is queued (in_progress), and the
API process's peak RSS over its baseline (sampled every 50 ms). Usage:
    .venv/bin/python bench/anthropic_create.py [--requests 50000] [--request-bytes 2000]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.ingest import PeakRss

ROOT = Path(__file__).resolve().parents[1]


def params(i: int, filler: str) -> dict[str, object]:
    return {"model": "fake-model", "max_tokens": 1, "messages": [{"role": "user", "content": f"{i} {filler}"}]}


def start(env: dict[str, str], port: int) -> subprocess.Popen[bytes]:
    backfill = [sys.executable, "-m", "worker.cli"]
    server = subprocess.Popen(
        [*backfill, "serve", "--port", str(port)],
        env=env,
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    for _ in range(300):
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health").json().get("worker") == "ready":
                return server
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise RuntimeError("server did not start")


def measure(server: subprocess.Popen[bytes], send: object, poll: object) -> dict[str, float]:
    baseline = psutil.Process(server.pid).memory_info().rss
    rss = PeakRss(server.pid)
    started = time.perf_counter()
    batch_id = send()  # type: ignore[operator]
    answered = time.perf_counter()
    while poll(batch_id):  # type: ignore[operator]
        time.sleep(0.05)
    queued = time.perf_counter()
    rss.stop.set()
    return {
        "create_seconds": round(answered - started, 2),
        "queued_seconds": round(queued - started, 2),
        "peak_rss_over_baseline_mb": round((rss.peak - baseline) / 2**20),
    }


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=50_000)
    parser.add_argument("--request-bytes", type=int, default=2000)
    args = parser.parse_args()
    out = ROOT / "bench" / "out" / "anthropic-create"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    filler = "x" * max(0, args.request_bytes - 120)
    requests = [{"custom_id": f"r{i}", "params": params(i, filler)} for i in range(args.requests)]
    body = json.dumps({"requests": requests}).encode()
    jsonl = b"".join(
        json.dumps(
            {"custom_id": r["custom_id"], "method": "POST", "url": "/v1/chat/completions", "body": r["params"]}
        ).encode()
        + b"\n"
        for r in requests
    )
    del requests
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("BACKFILL_")},
        "BACKFILL_DATA_DIR": str(out / "data"),
        "BACKFILL_MODELS": json.dumps({"fake-model": {"path": "fake:", "max_num_seqs": 256}}),
        "BACKFILL_MESSAGE_BATCH_MAX_BYTES": str(max(len(body), len(jsonl)) + 1),
        "BACKFILL_UPLOAD_MAX_BYTES": str(max(len(body), len(jsonl)) + 1),
        "BACKFILL_BATCH_MAX_REQUESTS": str(args.requests),
    }
    backfill = [sys.executable, "-m", "worker.cli"]
    subprocess.run([*backfill, "migrate"], env=env, check=True, cwd=ROOT, capture_output=True)
    made = subprocess.run(
        [*backfill, "keys", "create", "--tenant", "bench"],
        env=env,
        check=True,
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    key = made.stdout.strip().splitlines()[-1]
    port = 19000 + os.getpid() % 1000
    base = f"http://127.0.0.1:{port}"
    http = httpx.Client(base_url=base, timeout=900, headers={"x-api-key": key, "Authorization": f"Bearer {key}"})
    server = start(env, port)
    try:

        def anthropic_send() -> str:
            response = http.post("/v1/messages/batches", content=body, headers={"content-type": "application/json"})
            response.raise_for_status()
            return str(response.json()["id"])

        from sqlalchemy import create_engine, text

        database = create_engine(f"sqlite:///{out / 'data' / 'backfill.db'}")

        def anthropic_poll(batch_id: str) -> bool:
            # processing_status says in_progress while validating too; the row says when it is queued
            with database.connect() as conn:
                status = conn.execute(text("SELECT status FROM batches WHERE id = :id"), {"id": batch_id}).scalar()
            return bool(status == "validating")

        def openai_send() -> str:
            uploaded = http.post("/v1/files", files={"file": ("jobs.jsonl", jsonl)}, data={"purpose": "batch"})
            uploaded.raise_for_status()
            created = http.post(
                "/v1/batches",
                json={
                    "input_file_id": uploaded.json()["id"],
                    "endpoint": "/v1/chat/completions",
                    "completion_window": "24h",
                },
            )
            created.raise_for_status()
            return str(created.json()["id"])

        def openai_poll(batch_id: str) -> bool:
            return bool(http.get(f"/v1/batches/{batch_id}").json()["status"] == "validating")

        result = {
            "requests": args.requests,
            "anthropic_body_mb": round(len(body) / 1e6, 1),
            "openai_file_mb": round(len(jsonl) / 1e6, 1),
            "anthropic": measure(server, anthropic_send, anthropic_poll),
        }
        while http.get("/v1/messages/batches").json()["data"][0]["processing_status"] != "ended":
            time.sleep(0.5)
        result["openai"] = measure(server, openai_send, openai_poll)
        print(json.dumps(result, indent=2))
    finally:
        server.terminate()
        server.wait(30)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
