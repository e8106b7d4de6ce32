"""Writes per request on the Postgres queue (issue 41 section 1): lease renewals, and claim + record.

Runs against whichever `storage` Python imports first (`BACKFILL_BENCH_CODE`, default this checkout), so one
script measures two versions on the same machine in the same minute:

    BACKFILL_BENCH_CODE=/work/main .venv/bin/python bench/lease_renewal.py --out before.json
    .venv/bin/python bench/lease_renewal.py --out after.json

On a fresh database of `--requests` queued rows (4 tenants, ~2 KB result bodies):

* **renewals**: one worker holds N rows in flight (claimed in claims of `--claim`, as a runner refills) and
  renews them all `--renewals` times, as its writer thread does every 2 s: renewals/s, rows written (row
  versions: pg_stat_user_tables' inserts + updates + deletes), WAL bytes (this database's own records,
  pg_walinspect) and statements per renewal, for each N of `--inflight`;
* **claim + record**: workers claim `--claim` rows and record them in one transaction each, until the queue is
  empty: statements, transactions, rows written and WAL bytes per request.

Statements are counted with SQLAlchemy's `before_cursor_execute` (pg_stat_statements is not preloaded here).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import sqlalchemy as sa

HERE = Path(__file__).resolve().parents[1]
sys.path.insert(0, os.environ.get("BACKFILL_BENCH_CODE") or str(HERE))
sys.path.insert(1, str(HERE))

from bench._setup import OUT, PG_ADMIN, submit  # noqa: E402

MODEL = "fake-model"
BODY = {"id": "chatcmpl-x", "object": "chat.completion", "choices": [{"message": {"content": "word " * 380}}]}


class Meter:
    """Statements and commits the storage engine sent, rows written and WAL bytes of this database."""

    def __init__(self, url: str) -> None:
        from sqlalchemy import event

        from storage.db import get_engine

        self.admin = sa.create_engine(url, isolation_level="AUTOCOMMIT")
        # A temporary replication slot keeps the WAL from now on until this connection closes (bench/handback.py).
        self.holder = self.admin.connect()
        slot = f"leasebench_{os.getpid()}"
        self.holder.execute(sa.text("SELECT pg_create_physical_replication_slot(:s, true, true)"), {"s": slot})
        with self.admin.connect() as conn:
            conn.execute(sa.text("CREATE EXTENSION IF NOT EXISTS pg_walinspect"))
            oid = conn.execute(sa.text("SELECT oid FROM pg_database WHERE datname = current_database()")).scalar_one()
        self.pattern = f"%/{oid}/%"
        self.statements = self.commits = 0
        engine = get_engine()
        event.listen(engine, "before_cursor_execute", self._statement)
        event.listen(engine, "commit", self._commit)

    def _statement(self, *args: Any) -> None:
        self.statements += 1

    def _commit(self, *args: Any) -> None:
        self.commits += 1

    def snapshot(self) -> dict[str, Any]:
        from storage.db import get_engine

        get_engine().dispose()  # a closing backend flushes its table statistics
        time.sleep(0.3)
        with self.admin.connect() as conn:
            rows = conn.execute(
                sa.text(
                    "SELECT coalesce(sum(n_tup_ins + n_tup_upd + n_tup_del), 0), coalesce(sum(n_tup_hot_upd), 0)"
                    " FROM pg_stat_user_tables"
                )
            ).one()
            lsn = conn.execute(sa.text("SELECT pg_current_wal_flush_lsn()")).scalar_one()
        return {
            "rows": int(rows[0]),
            "hot": int(rows[1]),
            "lsn": lsn,
            "statements": self.statements,
            "commits": self.commits,
        }

    def since(self, before: dict[str, Any]) -> dict[str, Any]:
        after = self.snapshot()
        with self.admin.connect() as conn:
            wal = conn.execute(
                sa.text(
                    "SELECT coalesce(sum(record_length + fpi_length), 0), coalesce(sum(fpi_length), 0)"
                    " FROM pg_get_wal_records_info(CAST(:a AS pg_lsn), CAST(:b AS pg_lsn)) WHERE block_ref LIKE :p"
                ),
                {"a": before["lsn"], "b": after["lsn"], "p": self.pattern},
            ).one()
        return {
            "rows_written": after["rows"] - before["rows"],
            "hot_updates": after["hot"] - before["hot"],
            "wal_bytes": int(wal[0]),
            "wal_fpi_bytes": int(wal[1]),
            "statements": after["statements"] - before["statements"],
            "commits": after["commits"] - before["commits"],
        }


def claim_rows(worker_id: str, limit: int) -> list[str]:
    from storage.db import transaction
    from storage.queue.claim import claim
    from storage.settings import get_settings

    with transaction() as session:
        rows = claim(session, model=MODEL, worker_id=worker_id, limit=limit, lease_seconds=120, settings=get_settings())
    return [row.id for row in rows]


def record_rows(worker_id: str, ids: list[str]) -> None:
    from storage.db import transaction
    from storage.queue.results import Outcome, record

    with transaction() as session:
        record(
            session,
            worker_id=worker_id,
            run_id=f"run-{worker_id}",
            outcomes=[Outcome(rid, 200, BODY, 500, 380, 0.1) for rid in ids],
        )


def renew_rows(worker_id: str, ids: list[str]) -> set[str]:
    from storage.db import transaction
    from storage.queue.leases import renew

    with transaction() as session:
        return renew(session, worker_id=worker_id, request_ids=ids, lease_seconds=120)


def renewals(meter: Meter, *, inflight: int, claim_size: int, count: int) -> dict[str, Any]:
    """One worker holds `inflight` rows and renews them `count` times; then records them (the queue moves on)."""
    worker = f"renewer-{inflight}"
    held: list[str] = []
    while len(held) < inflight and (ids := claim_rows(worker, min(claim_size, inflight - len(held)))):
        held += ids
    before = meter.snapshot()
    began = time.perf_counter()
    for _ in range(count):
        lost = renew_rows(worker, held)
        assert not lost, f"{len(lost)} leases lost"
    seconds = time.perf_counter() - began
    spent = meter.since(before)
    for start in range(0, len(held), 256):
        record_rows(worker, held[start : start + 256])
    return {
        "inflight": len(held),
        "renewals": count,
        "renewals_per_s": round(count / seconds, 1),
        "rows_written_per_renewal": round(spent["rows_written"] / count, 1),
        "row_updates_per_s": round(spent["rows_written"] / seconds),
        "wal_bytes_per_renewal": round(spent["wal_bytes"] / count),
        "statements_per_renewal": round(spent["statements"] / count, 2),
    }


def claim_and_record(meter: Meter, *, claim_size: int) -> dict[str, Any]:
    """Claim `claim_size` rows and record them, until the queue is empty: costs per request."""
    before = meter.snapshot()
    done, began = 0, time.perf_counter()
    while ids := claim_rows("recorder", claim_size):
        record_rows("recorder", ids)
        done += len(ids)
    seconds = time.perf_counter() - began
    spent = meter.since(before)
    return {
        "requests": done,
        "requests_per_s": round(done / seconds),
        "statements_per_request": round(spent["statements"] / done, 3),
        "transactions_per_request": round(spent["commits"] / done, 3),
        "rows_written_per_request": round(spent["rows_written"] / done, 3),
        "wal_bytes_per_request": round(spent["wal_bytes"] / done),
        "wal_fpi_bytes_per_request": round(spent["wal_fpi_bytes"] / done),
    }


def populate(requests: int) -> None:
    per_job = requests // 8
    for job in range(8):
        lines = (
            {
                "custom_id": f"j{job}-{i}",
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": {"model": MODEL, "messages": [{"role": "user", "content": f"q {i} " * 40}], "max_tokens": 8},
            }
            for i in range(per_job)
        )
        submit(lines, tenant=f"tenant-{job % 4}", model=MODEL)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=40_000)
    parser.add_argument("--inflight", default="768,3072,12288")
    parser.add_argument("--claim", type=int, default=192)
    parser.add_argument("--renewals", type=int, default=40)
    parser.add_argument("--out", default=str(OUT / "lease_renewal.json"))
    args = parser.parse_args()
    dbname = f"backfill_leases_{uuid.uuid4().hex[:8]}"
    admin = sa.create_engine(PG_ADMIN, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(sa.text(f'CREATE DATABASE "{dbname}"'))
    url = f"postgresql+psycopg://postgres@127.0.0.1:5432/{dbname}"
    admin_db = sa.create_engine(url, isolation_level="AUTOCOMMIT")
    os.environ["BACKFILL_DATA_DIR"] = str(OUT / f"leases-{dbname}")
    os.environ["BACKFILL_MODELS"] = json.dumps({MODEL: {"path": "fake:", "max_num_seqs": 384}})
    os.environ["BACKFILL_DATABASE_URL"] = url
    try:
        from worker.cli.migrate import migrate_database

        migrate_database()
        populate(args.requests)
        with admin_db.connect() as conn:  # as autovacuum would have: the planner knows the table's size
            conn.execute(sa.text("VACUUM ANALYZE"))
        meter = Meter(url)
        runs = [
            renewals(meter, inflight=int(n), claim_size=args.claim, count=args.renewals)
            for n in args.inflight.split(",")
        ]
        for run in runs:
            print(json.dumps(run), flush=True)
        recorded = claim_and_record(meter, claim_size=args.claim)
        print(json.dumps(recorded), flush=True)
        import storage

        meter.holder.close()
        result = {
            "code": str(Path(storage.__file__).parents[1]),
            "claim_size": args.claim,
            "renewals": runs,
            "claim_record": recorded,
        }
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=2))
    finally:
        from storage.db import get_engine

        get_engine().dispose()
        admin_db.dispose()
        with admin.connect() as conn:
            conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)'))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
