"""Hostile and huge request bodies against the real API process (issue 18): peak RSS and /health latency.

Starts `backfill serve` (embedded: SQLite + a local folder, no worker needed for creates) with the default
limits and measures, each against the server's own baseline:
  * a 256 MB Anthropic create (100,000 requests of ~2.6 KB): seconds to the answer, peak RSS growth;
  * 40 concurrent Anthropic creates, each of 16 requests of ~1 MiB (the per-request limit): peak RSS growth;
  * the depth attack (100 KB: one request whose params open 100,000 arrays), alone and 40 at once;
and the slowest /health answer during each (polled every 50 ms). Usage:
    .venv/bin/python bench/hostile_bodies.py [--quick]
Writes bench/out/hostile-bodies.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.ingest import PeakRss

ROOT = Path(__file__).resolve().parents[1]
ATTACK = b'{"requests":[{"custom_id":"q0","params":{"model":"backfill-demo","max_tokens":4,"x":' + b"[" * 100_000


def start(env: dict[str, str], port: int, log: Path) -> subprocess.Popen[bytes]:
    """`backfill serve`, its output kept in `log` (a 5xx here is a finding: read why)."""
    sink = log.open("wb")
    server = subprocess.Popen(
        [sys.executable, "-m", "worker.cli", "serve", "--port", str(port)], env=env, cwd=ROOT, stdout=sink, stderr=sink
    )
    for _ in range(300):
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health").json().get("worker") == "ready":
                return server
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"server did not start: see {log}")


def body_of(count: int, request_bytes: int, tag: str) -> bytes:
    filler = "x" * max(0, request_bytes - 130)
    parts = [
        json.dumps(
            {
                "custom_id": f"{tag}{i}",
                "params": {"model": "fake-model", "max_tokens": 1, "messages": [{"role": "user", "content": filler}]},
            },
            separators=(",", ":"),
        ).encode()
        for i in range(count)
    ]
    return b'{"requests":[' + b",".join(parts) + b"]}"


class HealthProbe:
    """Polls /health every 50 ms from its own thread; keeps the slowest answer."""

    def __init__(self, base: str) -> None:
        self.base, self.slowest, self.failures = base, 0.0, 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        with httpx.Client(timeout=30) as client:
            while not self.stop.is_set():
                started = time.perf_counter()
                try:
                    ok = client.get(f"{self.base}/health").status_code == 200
                except httpx.HTTPError:
                    ok = False
                self.failures += 0 if ok else 1
                self.slowest = max(self.slowest, time.perf_counter() - started)
                time.sleep(0.05)


def measure(server: subprocess.Popen[bytes], base: str, send: Callable[[], list[int]]) -> dict[str, Any]:
    baseline = psutil.Process(server.pid).memory_info().rss
    rss, health = PeakRss(server.pid), HealthProbe(base)
    started = time.perf_counter()
    statuses = send()
    seconds = time.perf_counter() - started
    rss.stop.set()
    health.stop.set()
    health.thread.join()
    return {
        "statuses": sorted(set(statuses)),
        "seconds": round(seconds, 2),
        "baseline_rss_mb": round(baseline / 2**20),
        "peak_rss_over_baseline_mb": round((rss.peak - baseline) / 2**20),
        "health_slowest_seconds": round(health.slowest, 3),
        "health_failures": health.failures,
    }


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="a 32 MB create and 8 concurrent bodies")
    args = parser.parse_args()
    out = ROOT / "bench" / "out" / "hostile-bodies"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("BACKFILL_")},
        "BACKFILL_DATA_DIR": str(out / "data"),
        "BACKFILL_MODELS": json.dumps({"fake-model": {"path": "fake:"}}),
        "BACKFILL_TENANT_MAX_OPEN_BATCHES": "0",
        "MALLOC_ARENA_MAX": "2",  # as the image runs the API (infra/docker)
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
    port = 19500 + os.getpid() % 400
    base = f"http://127.0.0.1:{port}"
    headers = {"x-api-key": key, "content-type": "application/json"}
    requests, concurrent = (12_500, 8) if args.quick else (100_000, 40)
    bodies = {"big": body_of(requests, 2_600, "r")}
    large = [body_of(16, 1_000_000, f"c{n}-") for n in range(concurrent)]
    server = start(env, port, out / "server.log")
    result: dict[str, Any] = {"create_body_mb": round(len(bodies["big"]) / 2**20, 1), "create_requests": requests}
    try:
        with httpx.Client(base_url=base, timeout=1800, headers=headers) as http:

            def post(body: bytes) -> int:
                return http.post("/v1/messages/batches", content=body).status_code

            def many(bodies: list[bytes]) -> list[int]:
                with ThreadPoolExecutor(len(bodies)) as pool:
                    return list(pool.map(post, bodies))

            result["create_256mb"] = measure(server, base, lambda: [post(bodies.pop("big"))])
            result["concurrent_large_bodies"] = {
                "bodies": concurrent,
                "body_mb": round(len(large[0]) / 2**20, 1),
                **measure(server, base, lambda: many(large)),
            }
            result["depth_attack"] = measure(server, base, lambda: [post(ATTACK)])
            result["depth_attack_x40"] = measure(server, base, lambda: many([ATTACK] * 40))
    finally:
        server.terminate()
        server.wait(30)
    (ROOT / "bench" / "out" / "hostile-bodies.json").write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
