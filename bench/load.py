"""Concurrency: N clients at once, each uploading a JSONL file and creating a batch, against `backfill serve`.

While they run, a probe measures `/health` and `GET /v1/batches` latency every 50 ms. Prints the errors
(by kind), the p50/p99 of both probes and of the clients' upload + create, and any orphan object (an
object in storage that no file row or batch manifest names). Usage:

    .venv/bin/python bench/load.py [--clients 100] [--lines 20] [--postgres] [--s3]

The embedded default (SQLite, local folder, in-process worker on a fake engine) unless --postgres/--s3.
`drive` is also the load of the bounded test (tests/integration/api/test_load.py).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]


def job(client: int, lines: int) -> bytes:
    """A small chat job for one client."""
    rows = [
        {
            "custom_id": f"c{client}-r{i}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {"model": "fake-model", "messages": [{"role": "user", "content": f"hi {i}"}], "max_tokens": 2},
        }
        for i in range(lines)
    ]
    return b"".join(json.dumps(row).encode() + b"\n" for row in rows)


@dataclass
class LoadResult:
    clients: int
    errors: Counter[str] = field(default_factory=Counter)
    batch_ids: list[str] = field(default_factory=list)
    client_seconds: list[float] = field(default_factory=list)
    health_seconds: list[float] = field(default_factory=list)
    list_seconds: list[float] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        return {
            "clients": self.clients,
            "batches_created": len(self.batch_ids),
            "errors": sum(self.errors.values()),
            "error_kinds": dict(self.errors),
            "client_p50_s": _pct(self.client_seconds, 50),
            "client_p99_s": _pct(self.client_seconds, 99),
            "health_p50_ms": _pct(self.health_seconds, 50, 1000),
            "health_p99_ms": _pct(self.health_seconds, 99, 1000),
            "list_batches_p50_ms": _pct(self.list_seconds, 50, 1000),
            "list_batches_p99_ms": _pct(self.list_seconds, 99, 1000),
            "probes": len(self.health_seconds),
        }


def _pct(values: list[float], q: int, scale: float = 1.0) -> float | None:
    if not values:
        return None
    if len(values) == 1:
        return round(values[0] * scale, 3)
    return round(statistics.quantiles(values, n=100, method="inclusive")[q - 1] * scale, 3)


def drive(base_url: str, keys: Callable[[int], str], *, clients: int, lines: int = 20, rounds: int = 1) -> LoadResult:
    """Run `clients` threads at once (each: upload, create a batch; `rounds` times) with a latency probe beside."""
    result = LoadResult(clients)
    start = threading.Barrier(clients + 1)
    done = threading.Event()
    lock = threading.Lock()

    def one(index: int) -> None:
        headers = {"Authorization": f"Bearer {keys(index)}"}
        with httpx.Client(base_url=base_url, headers=headers, timeout=120) as http:
            start.wait()
            for round_ in range(rounds):
                if not _round(http, index, round_):
                    return

    def _round(http: httpx.Client, index: int, round_: int) -> bool:
        began = time.perf_counter()
        try:
            data = job(index * 1000 + round_, lines)
            up = http.post("/v1/files", data={"purpose": "batch"}, files={"file": ("j.jsonl", io.BytesIO(data))})
            if up.status_code != 200:
                raise RuntimeError(f"upload HTTP {up.status_code}: {up.text[:120]}")
            body = {
                "input_file_id": up.json()["id"],
                "endpoint": "/v1/chat/completions",
                "completion_window": "24h",
            }
            created = http.post("/v1/batches", json=body)
            if created.status_code != 200:
                raise RuntimeError(f"create HTTP {created.status_code}: {created.text[:120]}")
        except Exception as error:  # every failure is counted by kind, none stops the others
            with lock:
                result.errors[str(error).split(":")[0] if "HTTP" in str(error) else type(error).__name__] += 1
            return False
        with lock:
            result.client_seconds.append(time.perf_counter() - began)
            result.batch_ids.append(created.json()["id"])
        return True

    def probe() -> None:
        headers = {"Authorization": f"Bearer {keys(0)}"}
        with httpx.Client(base_url=base_url, headers=headers, timeout=120) as http:
            while not done.is_set():
                for path, sink in (("/health", result.health_seconds), ("/v1/batches?limit=20", result.list_seconds)):
                    began = time.perf_counter()
                    try:
                        ok = http.get(path).status_code == 200
                    except httpx.HTTPError:
                        ok = False
                    if ok:
                        sink.append(time.perf_counter() - began)
                    else:
                        with lock:
                            result.errors[f"probe {path.split('?')[0]}"] += 1
                time.sleep(0.05)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(clients)]
    for thread in threads:
        thread.start()
    prober = threading.Thread(target=probe)
    prober.start()
    start.wait()
    for thread in threads:
        thread.join()
    done.set()
    prober.join()
    return result


def _serve(env: dict[str, str], port: int) -> tuple[subprocess.Popen[bytes], str]:
    backfill = [sys.executable, "-m", "worker.cli"]
    subprocess.run([*backfill, "migrate"], env=env, check=True, cwd=ROOT, capture_output=True)
    made = subprocess.run(
        [*backfill, "keys", "create", "--tenant", "load"], env=env, check=True, cwd=ROOT, capture_output=True, text=True
    )
    key = made.stdout.strip().splitlines()[-1]
    log = open(Path(env["BACKFILL_DATA_DIR"]) / "serve.log", "wb")  # noqa: SIM115 - lives as long as the server
    server = subprocess.Popen([*backfill, "serve", "--port", str(port)], env=env, cwd=ROOT, stdout=log, stderr=log)
    for _ in range(300):
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200:
                return server, key
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    server.kill()
    raise RuntimeError("the server did not start")


def orphans(env: dict[str, str]) -> int:
    """Objects in the local store or bucket that no file row (or batch manifest) names."""
    os.environ.update(env)
    from storage.db import transaction
    from storage.files.blobs import get_blob_store
    from storage.models import Batch, File

    with transaction() as session:
        keys = {row.blob_key for row in session.query(File)}
        keys |= {row.manifest_key for row in session.query(Batch) if row.manifest_key}
    store: Any = get_blob_store()
    if hasattr(store, "client"):
        listed = store.client.list_objects_v2(Bucket=store.bucket).get("Contents", [])
        stored = {item["Key"] for item in listed}
    else:
        stored = {str(p.relative_to(store.root)) for p in store.root.rglob("*") if p.is_file()}
    return len(stored - keys)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=100)
    parser.add_argument("--lines", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3, help="upload + create this many times per client")
    parser.add_argument("--postgres", action="store_true", help="Postgres instead of SQLite")
    parser.add_argument("--s3", action="store_true", help="moto's S3 server instead of a local folder")
    args = parser.parse_args()
    if not 1 <= args.clients <= 1000 or not 1 <= args.lines <= 10_000 or not 1 <= args.rounds <= 100:
        parser.error("--clients must be 1..1000, --lines 1..10000 and --rounds 1..100")
    sys.path.insert(0, str(ROOT / "bench"))
    from _setup import fresh_postgres

    data = ROOT / "bench" / "out" / f"load-{os.getpid()}"
    data.mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ,
        "BACKFILL_DATA_DIR": str(data),
        "BACKFILL_MODELS": json.dumps({"fake-model": {"path": "fake:", "max_num_seqs": 64}}),
        "BACKFILL_LOG_LEVEL": "WARNING",
        # Its one tenant's 100 clients load the request threads themselves: a tenant's share (an eighth of them)
        # would refuse most (bench/tenant_share.py measures the share).
        "BACKFILL_TENANT_MAX_CONCURRENT_REQUESTS": "0",
    }
    moto = None
    if args.postgres:
        url = fresh_postgres("backfill_load")
        if url is None:
            parser.error("no Postgres server at 127.0.0.1:5432")
        env["BACKFILL_DATABASE_URL"] = url
    if args.s3:
        from moto.server import ThreadedMotoServer

        aws = {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench", "AWS_DEFAULT_REGION": "us-east-1"}
        env.update(aws)
        os.environ.update(aws)
        moto = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        moto.start()
        env["BACKFILL_S3_ENDPOINT_URL"] = f"http://127.0.0.1:{moto._server.server_port}"  # type: ignore[attr-defined]
        env["BACKFILL_S3_BUCKET"] = "load"
        import boto3

        boto3.client("s3", endpoint_url=env["BACKFILL_S3_ENDPOINT_URL"]).create_bucket(Bucket="load")
    port = 19000 + os.getpid() % 1000
    server, key = _serve(env, port)
    try:
        result = drive(
            f"http://127.0.0.1:{port}", lambda _: key, clients=args.clients, lines=args.lines, rounds=args.rounds
        )
    finally:
        server.terminate()
        server.wait(30)
    summary = {"backend": ("postgres" if args.postgres else "sqlite") + ("+s3" if args.s3 else ""), **result.summary()}
    summary["orphan_objects"] = orphans(env)
    print(json.dumps(summary, indent=2))
    if moto is not None:
        moto.stop()
    return 0 if not summary["errors"] and not summary["orphan_objects"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
