"""One claim on Postgres, statement by statement, at `--rows` queued requests (issue 41: where a claim's time goes).

bench/fleet.py's queue (its populate: 4 tenants' batches through the real ingest, cloned in SQL, VACUUM ANALYZE), then
`--claims` claims of `--limit` rows each (storage/queue/claim.py `claim`, as a runner's claimer calls it, each by a
worker of its own, one at a time), with every statement they send counted and timed on the client. Then the
statements of one more claim are replayed under EXPLAIN (ANALYZE, BUFFERS) inside a transaction that is rolled back.
Prints statements per claim, ms per claim (median, p90) and each statement kind's share; writes
bench/out/claim_profile.json. Usage:
    .venv/bin/python bench/claim_profile.py [--rows 100000] [--claims 30] [--limit 192]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import sqlalchemy as sa

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._setup import OUT, fresh_postgres

MODEL = "fleet-model"


def kind(statement: str) -> str:
    """A statement's kind: its verb and first table, and what it locks or returns."""
    words = re.sub(r"\s+", " ", statement).strip()
    verb = words.split(" ", 1)[0].upper()
    table = re.search(r"(?:FROM|UPDATE|INTO) (\w+)", words)
    extra = " FOR UPDATE SKIP LOCKED" if "SKIP LOCKED" in words else (" RETURNING" if "RETURNING" in words else "")
    agg = " (aggregate)" if re.search(r"\b(count|sum|min|max)\(", words) else ""
    return f"{verb} {table.group(1) if table else '?'}{agg}{extra}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--claims", type=int, default=30)
    parser.add_argument("--limit", type=int, default=192)
    args = parser.parse_args()
    os.environ["BACKFILL_MODELS"] = json.dumps({MODEL: {"path": "fake:", "max_num_seqs": 384}})
    os.environ["BACKFILL_DATA_DIR"] = str(OUT / "claim-profile-data")
    url = fresh_postgres("backfill_claim_profile")
    assert url, "no Postgres"
    os.environ["BACKFILL_DATABASE_URL"] = url
    from bench.fleet import populate
    from storage.db import get_engine, get_sessionmaker
    from storage.queue.claim import claim
    from storage.settings import get_settings
    from worker.cli.migrate import migrate_database

    migrate_database()
    populate(url, "long", args.rows)
    settings = get_settings()
    engine = get_engine()
    current: list[tuple[str, Any, float]] = []
    started: dict[int, float] = {}

    def before(_c: Any, cursor: Any, statement: str, parameters: Any, _ctx: Any, _many: bool) -> None:
        started[id(cursor)] = time.perf_counter()

    def after(_c: Any, cursor: Any, statement: str, parameters: Any, _ctx: Any, _many: bool) -> None:
        current.append((statement, parameters, time.perf_counter() - started.pop(id(cursor), time.perf_counter())))

    def one_claim(worker: str, *, commit: bool = True) -> tuple[float, list[tuple[str, Any, float]], int]:
        current.clear()
        began = time.perf_counter()
        session = get_sessionmaker()()
        try:
            rows = claim(session, model=MODEL, worker_id=worker, limit=args.limit, lease_seconds=120, settings=settings)
            session.commit() if commit else session.rollback()
        finally:
            session.close()
        return time.perf_counter() - began, list(current), len(rows)

    sa.event.listen(engine, "before_cursor_execute", before)
    sa.event.listen(engine, "after_cursor_execute", after)
    one_claim("warm-up")  # the horizon's sum and the connection's first statements, as a worker's first claim
    seconds, counts, by_kind, claimed = [], [], defaultdict(float), 0
    for index in range(args.claims):
        took, statements, rows = one_claim(f"worker-{index}")
        seconds.append(took)
        counts.append(len(statements))
        claimed += rows
        for statement, _, spent in statements:
            by_kind[kind(statement)] += spent
    _, last, _ = one_claim("explained", commit=False)  # replayed below
    sa.event.remove(engine, "before_cursor_execute", before)
    sa.event.remove(engine, "after_cursor_execute", after)
    plans = []
    with engine.connect() as conn:
        transaction_ = conn.begin()
        for statement, parameters, spent in last:
            explained = conn.exec_driver_sql("EXPLAIN (ANALYZE, BUFFERS) " + statement, parameters)
            plans.append(
                {"kind": kind(statement), "client_ms": round(spent * 1000, 2), "plan": [r[0] for r in explained]}
            )
        transaction_.rollback()
    total = sum(by_kind.values())
    result = {
        "rows": args.rows,
        "claims": args.claims,
        "limit": args.limit,
        "claimed": claimed,
        "statements_per_claim": statistics.median(counts),
        "statements_per_claim_range": [min(counts), max(counts)],
        "claim_ms_median": round(statistics.median(seconds) * 1000, 2),
        "claim_ms_p90": round(sorted(seconds)[int(0.9 * (len(seconds) - 1))] * 1000, 2),
        "share_by_kind": {k: round(v / total, 3) for k, v in sorted(by_kind.items(), key=lambda kv: -kv[1])},
        "ms_per_claim_by_kind": {
            k: round(v * 1000 / args.claims, 2) for k, v in sorted(by_kind.items(), key=lambda kv: -kv[1])
        },
        "plans": plans,
    }
    print(json.dumps({k: v for k, v in result.items() if k != "plans"}, indent=1))
    for item in plans:
        print(f"--- {item['kind']} ({item['client_ms']} ms on the client)")
        print("\n".join(item["plan"]))
    OUT.mkdir(exist_ok=True)
    (OUT / "claim_profile.json").write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
