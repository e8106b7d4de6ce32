"""`POST /v1/batches/estimate` on a file with one 100 MiB line (issue 14, item 3): time, server RSS, and
`/health` latency while three such estimates run at once, against `backfill serve` of any checkout.

    .venv/bin/python bench/hostile_estimate.py [--line-mib 100] [--root PATH_OF_A_CHECKOUT]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import psutil

ROOT = Path(__file__).resolve().parents[1]
ROUNDS = 5


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--line-mib", type=int, default=100)
    parser.add_argument("--root", type=Path, default=ROOT, help="the checkout whose server to measure")
    args = parser.parse_args()
    if not 1 <= args.line_mib <= 180:
        parser.error("--line-mib must be 1..180 (the upload limit is 200 MB)")
    data_dir = Path(tempfile.mkdtemp(prefix="backfill-estimate-"))
    env = {
        **os.environ,
        "PYTHONPATH": str(args.root),
        "BACKFILL_DATA_DIR": str(data_dir),
        "BACKFILL_MODELS": json.dumps({"fake-model": {"path": "fake:"}}),
        "BACKFILL_LOG_LEVEL": "WARNING",
    }
    cli = [sys.executable, "-m", "worker.cli"]
    subprocess.run([*cli, "migrate"], env=env, cwd=args.root, check=True, capture_output=True)
    made = subprocess.run(
        [*cli, "keys", "create", "--tenant", "bench"],
        env=env,
        cwd=args.root,
        check=True,
        capture_output=True,
        text=True,
    )
    key = made.stdout.strip().splitlines()[-1]
    port = 19500 + os.getpid() % 400
    server = subprocess.Popen(
        [*cli, "serve", "--port", str(port)],
        env=env,
        cwd=args.root,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(300):
            try:
                if httpx.get(f"{base}/health").status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        result = measure(base, key, server.pid, args.line_mib)
    finally:
        server.terminate()
        server.wait(30)
    print(json.dumps({"root": str(args.root), "line_mib": args.line_mib, **result}, indent=2))
    return 0


def measure(base: str, key: str, pid: int, line_mib: int) -> dict[str, object]:
    headers = {"Authorization": f"Bearer {key}"}
    first = {"custom_id": "r0", "method": "POST", "url": "/v1/chat/completions", "body": {"model": "fake-model"}}
    data = json.dumps(first).encode() + b"\n" + b'{"custom_id": "big", "x": "' + b"a" * (line_mib << 20) + b'"}\n'
    with httpx.Client(base_url=base, headers=headers, timeout=600) as http:
        up = http.post("/v1/files", data={"purpose": "batch"}, files={"file": ("big.jsonl", io.BytesIO(data))})
        up.raise_for_status()
        body = {"input_file_id": up.json()["id"], "endpoint": "/v1/chat/completions", "completion_window": "24h"}
        process = psutil.Process(pid)
        rss = [process.memory_info().rss]
        stop = threading.Event()

        def sample() -> None:
            while not stop.is_set():
                rss.append(process.memory_info().rss)
                time.sleep(0.02)

        idle = []
        with httpx.Client(base_url=base, timeout=60) as probe_client:
            for _ in range(20):
                began = time.perf_counter()
                probe_client.get("/health")
                idle.append(time.perf_counter() - began)
        sampler = threading.Thread(target=sample)
        sampler.start()
        started = time.perf_counter()
        one = http.post("/v1/batches/estimate", json=body)
        single = time.perf_counter() - started
        health: list[float] = []
        done = threading.Event()

        def probe() -> None:
            with httpx.Client(base_url=base, timeout=60) as probe_client:
                while not done.is_set():
                    began = time.perf_counter()
                    probe_client.get("/health")
                    health.append(time.perf_counter() - began)
                    time.sleep(0.05)

        prober = threading.Thread(target=probe)
        prober.start()

        def estimates() -> None:  # three clients, each asking ROUNDS times: long enough for many probes
            for _ in range(ROUNDS):
                http.post("/v1/batches/estimate", json=body)

        threads = [threading.Thread(target=estimates) for _ in range(3)]
        started = time.perf_counter()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        three = time.perf_counter() - started
        done.set()
        prober.join()
        stop.set()
        sampler.join()
    return {
        "estimate_status": one.status_code,
        "estimate": {k: one.json().get(k) for k in ("requests", "skipped_lines")}
        if one.status_code == 200
        else one.text[:200],
        "one_estimate_s": round(single, 3),
        "three_concurrent_s_per_round": round(three / ROUNDS, 3),
        "rss_growth_mb": round((max(rss) - rss[0]) / 1e6, 1),
        "health_idle_p50_ms": round(statistics.median(idle) * 1000, 1),
        "health_p50_ms": round(statistics.median(health) * 1000, 1),
        "health_p99_ms": round(statistics.quantiles(health, n=100, method="inclusive")[98] * 1000, 1),
        "health_max_ms": round(max(health) * 1000, 1),
        "health_probes": len(health),
    }


if __name__ == "__main__":
    raise SystemExit(main())
