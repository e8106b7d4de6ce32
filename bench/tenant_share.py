"""A tenant's share of the request threads (issue 36 §11): another tenant's latency while one runs 100 clients.

Starts `backfill serve` (embedded: SQLite, the in-process worker on a fake engine; `--postgres` for Postgres), seeds
the hog tenant with `--batches` batches, then for `--seconds` runs `--clients` threads of the hog listing its
batches (`GET /v1/batches?limit=20`, one after another with no pause) while a probe of another tenant reads one
of its batches (`GET /v1/batches/{id}`) every 50 ms. Hog clients either retry a 429 at once (`hostile`, the worst
case for the server) or after its Retry-After (`sdk`, as the openai and anthropic SDKs do). Runs once with the
share off (BACKFILL_TENANT_MAX_CONCURRENT_REQUESTS=0, as before the share) and once with the share on (its
default, an eighth of the 40 threads, or `--share N`), and prints the probe's p50/p99/max and the hog's answers
by status as JSON. Usage:

    .venv/bin/python bench/tenant_share.py [--clients 100] [--seconds 20] [--hog hostile|sdk] [--share N] [--postgres]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from load import _pct, _serve, job  # noqa: E402  (bench/ is a folder of scripts)

PROBE_EVERY_SECONDS = 0.05


def seed(base_url: str, key: str, batches: int) -> list[str]:
    """`batches` small batches of the tenant (its list then reads rows, usage and retries per page)."""
    ids = []
    with httpx.Client(base_url=base_url, headers={"Authorization": f"Bearer {key}"}, timeout=60) as http:
        for index in range(batches):
            up = http.post(
                "/v1/files", data={"purpose": "batch"}, files={"file": ("j.jsonl", io.BytesIO(job(index, 3)))}
            )
            body = {"input_file_id": up.json()["id"], "endpoint": "/v1/chat/completions", "completion_window": "24h"}
            ids.append(http.post("/v1/batches", json=body).json()["id"])
    return ids


def measure(base_url: str, hog: str, neighbour: str, *, clients: int, seconds: float, mode: str) -> dict[str, Any]:
    """Run the hog's clients and the neighbour's probe together; the probe's latencies and the hog's statuses."""
    [probe_batch] = seed(base_url, neighbour, 1)
    stop = threading.Event()
    statuses: Counter[int | str] = Counter()
    lock = threading.Lock()

    def hog_client() -> None:
        with httpx.Client(base_url=base_url, headers={"Authorization": f"Bearer {hog}"}, timeout=120) as http:
            while not stop.is_set():
                try:
                    response = http.get("/v1/batches", params={"limit": 20})
                    status: int | str = response.status_code
                except httpx.HTTPError as error:
                    response, status = None, type(error).__name__
                with lock:
                    statuses[status] += 1
                if mode == "sdk" and response is not None and response.status_code == 429:
                    stop.wait(float(response.headers.get("retry-after", "1")))

    latencies: list[float] = []
    failures: Counter[int | str] = Counter()
    threads = [threading.Thread(target=hog_client) for _ in range(clients)]
    for thread in threads:
        thread.start()
    time.sleep(1)  # the hog's clients are all sending
    with httpx.Client(base_url=base_url, headers={"Authorization": f"Bearer {neighbour}"}, timeout=120) as http:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            began = time.perf_counter()
            try:
                code: int | str = http.get(f"/v1/batches/{probe_batch}").status_code
            except httpx.HTTPError as error:
                code = type(error).__name__
            if code == 200:
                latencies.append(time.perf_counter() - began)
            else:
                failures[code] += 1
            time.sleep(PROBE_EVERY_SECONDS)
    stop.set()
    for thread in threads:
        thread.join()
    return {
        "probe_p50_ms": _pct(latencies, 50, 1000),
        "probe_p99_ms": _pct(latencies, 99, 1000),
        "probe_max_ms": round(max(latencies) * 1000, 1) if latencies else None,
        "probes": len(latencies),
        "probe_failures": dict(failures),
        "hog_answers": {str(status): count for status, count in sorted(statuses.items(), key=str)},
    }


def run(share_on: bool, args: argparse.Namespace, port: int) -> dict[str, Any]:
    """One server, the share off (0) or at its default; the measurement."""
    data = ROOT / "bench" / "out" / f"tenant-share-{os.getpid()}-{'on' if share_on else 'off'}"
    data.mkdir(parents=True, exist_ok=True)
    env = {
        **{name: value for name, value in os.environ.items() if name != "BACKFILL_TENANT_MAX_CONCURRENT_REQUESTS"},
        "BACKFILL_DATA_DIR": str(data),
        "BACKFILL_MODELS": json.dumps({"fake-model": {"path": "fake:", "max_num_seqs": 64}}),
        "BACKFILL_LOG_LEVEL": "WARNING",
    }
    if not share_on or args.share is not None:
        env["BACKFILL_TENANT_MAX_CONCURRENT_REQUESTS"] = "0" if not share_on else str(args.share)
    if args.postgres:
        from _setup import fresh_postgres

        url = fresh_postgres("backfill_share")
        if url is None:
            raise SystemExit("no Postgres server at 127.0.0.1:5432")
        env["BACKFILL_DATABASE_URL"] = url
    server, hog = _serve(env, port)
    try:
        made = subprocess.run(
            [sys.executable, "-m", "worker.cli", "keys", "create", "--tenant", "neighbour"],
            env=env,
            check=True,
            cwd=ROOT,
            capture_output=True,
            text=True,
        )
        neighbour = made.stdout.strip().splitlines()[-1]
        base_url = f"http://127.0.0.1:{port}"
        seed(base_url, hog, args.batches)
        result = measure(base_url, hog, neighbour, clients=args.clients, seconds=args.seconds, mode=args.hog)
    finally:
        server.terminate()
        server.wait(30)
    share = "off" if not share_on else f"{args.share}" if args.share is not None else "default (5 of 40 threads)"
    return {"share": share, **result}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=100)
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument("--batches", type=int, default=40, help="the hog's batches (what its list reads)")
    parser.add_argument("--hog", choices=("hostile", "sdk"), default="hostile")
    parser.add_argument("--postgres", action="store_true")
    parser.add_argument("--only", choices=("off", "on"), help="run one side only")
    parser.add_argument("--share", type=int, help="the share when on (default: the setting's default)")
    args = parser.parse_args()
    if not 1 <= args.clients <= 1000 or not 1 <= args.seconds <= 600 or not 1 <= args.batches <= 1000:
        parser.error("--clients must be 1..1000, --seconds 1..600 and --batches 1..1000")
    port = 19000 + os.getpid() % 1000
    sides = ["off", "on"] if args.only is None else [args.only]
    results = [run(side == "on", args, port + (side == "on")) for side in sides]
    report = {"backend": "postgres" if args.postgres else "sqlite", "clients": args.clients, "hog": args.hog}
    print(json.dumps({**report, "runs": results}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
