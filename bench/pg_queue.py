"""Queue benchmark: claim + complete throughput of the Postgres queue with several concurrent workers.

Each worker process loops as a GPU worker's runner does, minus the engine: claim up to `--claim` rows
(one short transaction: fair share by tenant, earliest deadline first, SKIP LOCKED, lease), then record
a small 200 result for each (one short transaction: batch locks, executemany UPDATE with the lease
check, counters). The queue holds `--jobs` batches from `--tenants` tenants. After every run the
database is checked: every row completed once, attempts = 1, no id claimed by two workers, and the
batches' counters add up. Usage:
    .venv/bin/python bench/pg_queue.py [--requests 50000] [--workers 1,2,4,8] [--claim 256]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import sqlalchemy as sa

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._setup import OUT, PG_ADMIN, submit


def _worker(url: str, claim_size: int, start: Any, results: Any, index: int) -> None:
    os.environ["BACKFILL_DATABASE_URL"] = url
    from storage.db import transaction
    from storage.queue.claim import claim
    from storage.queue.results import Outcome, record
    from storage.settings import get_settings

    worker_id = f"bench-{index}"
    claimed: list[str] = []
    body = {"id": "x", "object": "chat.completion", "choices": []}
    start.wait()
    began = time.perf_counter()
    while True:
        with transaction() as session:
            rows = claim(
                session,
                settings=get_settings(),
                model="fake-model",
                worker_id=worker_id,
                limit=claim_size,
                lease_seconds=120,
            )
        if not rows:
            break
        claimed.extend(row.id for row in rows)
        outcomes = [Outcome(row.id, 200, body, 10, 1, 0.0) for row in rows]
        with transaction() as session:
            record(session, worker_id=worker_id, run_id=f"run-{index}", outcomes=outcomes)
    results.put((index, began, time.perf_counter(), claimed))


def populate(url: str, *, requests: int, jobs: int, tenants: int) -> None:
    os.environ["BACKFILL_DATABASE_URL"] = url
    per_job = requests // jobs
    for job in range(jobs):
        lines = (
            {
                "custom_id": f"j{job}-{i}",
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": {"model": "fake-model", "messages": [{"role": "user", "content": f"{i}"}], "max_tokens": 1},
            }
            for i in range(per_job)
        )
        submit(lines, tenant=f"tenant-{job % tenants}", model="fake-model")


def reset(engine: sa.Engine) -> None:
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                "UPDATE batch_requests SET status='queued', attempts=0, lease_owner=NULL, lease_id=NULL,"
                " response_status=NULL, response_body=NULL, run_id=NULL, finished_at=NULL"
            )
        )
        conn.execute(sa.text("UPDATE batches SET request_completed=0, request_failed=0"))
        conn.execute(sa.text("DELETE FROM leases"))
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(sa.text("VACUUM ANALYZE batch_requests"))


def run(url: str, *, workers: int, claim_size: int) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    start = ctx.Event()
    results = ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(url, claim_size, start, results, i)) for i in range(workers)]
    for proc in procs:
        proc.start()
    time.sleep(3.0)  # let every worker import and connect before the clock starts
    start.set()
    outs = [results.get(timeout=600) for _ in procs]
    for proc in procs:
        proc.join()
    began = min(o[1] for o in outs)
    ended = max(o[2] for o in outs)
    ids = [request_id for o in outs for request_id in o[3]]
    return {"seconds": ended - began, "claimed": len(ids), "distinct": len(set(ids))}


def check(engine: sa.Engine, total: int) -> dict[str, int]:
    with engine.connect() as conn:
        completed = conn.scalar(sa.text("SELECT count(*) FROM batch_requests WHERE status='completed'"))
        once = conn.scalar(sa.text("SELECT count(*) FROM batch_requests WHERE attempts=1"))
        counted = conn.scalar(sa.text("SELECT sum(request_completed) FROM batches"))
    return {"completed": int(completed or 0), "attempts_1": int(once or 0), "batch_counters": int(counted or 0)}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=50_000)
    parser.add_argument("--jobs", type=int, default=20)
    parser.add_argument("--tenants", type=int, default=5)
    parser.add_argument("--workers", default="1,2,4,8")
    parser.add_argument("--claim", type=int, default=256)
    args = parser.parse_args()
    dbname = f"backfill_queue_{uuid.uuid4().hex[:8]}"
    admin = sa.create_engine(PG_ADMIN, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(sa.text(f'CREATE DATABASE "{dbname}"'))
    url = f"postgresql+psycopg://postgres@127.0.0.1:5432/{dbname}"
    os.environ["BACKFILL_DATA_DIR"] = str(OUT / f"queue-{dbname}")
    os.environ["BACKFILL_MODELS"] = json.dumps({"fake-model": {"path": "fake:", "max_num_seqs": 256}})
    os.environ["BACKFILL_DATABASE_URL"] = url
    engine = sa.create_engine(url)
    try:
        from worker.cli.migrate import migrate_database

        migrate_database()
        populate(url, requests=args.requests, jobs=args.jobs, tenants=args.tenants)
        with engine.connect() as conn:
            total = int(conn.scalar(sa.text("SELECT count(*) FROM batch_requests")) or 0)
        runs = []
        for workers in [int(w) for w in args.workers.split(",")]:
            reset(engine)
            measured = run(url, workers=workers, claim_size=args.claim)
            verified = check(engine, total)
            exactly_once = (
                measured["claimed"] == measured["distinct"] == total
                and verified["completed"] == verified["attempts_1"] == verified["batch_counters"] == total
            )
            runs.append(
                {
                    "workers": workers,
                    "seconds": round(measured["seconds"], 2),
                    "requests_per_s": round(total / measured["seconds"]),
                    "double_claims": measured["claimed"] - measured["distinct"],
                    "exactly_once": exactly_once,
                    **verified,
                }
            )
            print(json.dumps(runs[-1]), flush=True)
        best = max(runs, key=lambda r: r["requests_per_s"])
        result = {
            "requests": total,
            "jobs": args.jobs,
            "tenants": args.tenants,
            "claim_size": args.claim,
            "runs": runs,
            "best_requests_per_s": best["requests_per_s"],
            "best_workers": best["workers"],
            "no_double_claims": all(r["exactly_once"] and r["double_claims"] == 0 for r in runs),
        }
        print(json.dumps(result, indent=2))
        OUT.mkdir(exist_ok=True)
        (OUT / "queue.json").write_text(json.dumps(result))
    finally:
        engine.dispose()
        with admin.connect() as conn:
            conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)'))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
