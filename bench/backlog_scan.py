"""The urgency horizon's backlog read on Postgres, before and after the queue index carried the rows' sizes (issue 41).

The urgency horizon needs the model's open backlog at most 15 s old (storage/queue/claim_order.py `urgency_horizon`
-> storage/queue/backlog.py `drain_seconds`); each worker process used to sum it for itself, now one sums it for the
fleet and the others read the sum's row (storage/queue/fleet_backlog.py). One database of `--rows` queued requests (bench/fleet.py's populate:
real ingest, then cloned in SQL), and in the same run, on the same rows:

* before: the read as it was (each open job's sizes grouped off the rows, summed in Python) on the queue index as
  it was (no sizes);
* after: one sum, on the queue index with the sizes (INCLUDE), read off the index alone;
* shared: what the rest of the fleet reads meanwhile, the last sum's row (storage/queue/fleet_backlog.py);
* after, churned: the same once a tenth of the rows were claimed and handed back since the last VACUUM (their
  pages no longer all-visible: the index-only scan visits their heap), as a live queue's would be.

Each is timed `--repeat` times (median and min, ms), its answers compared (they must be equal) and its plan kept
(EXPLAIN ANALYZE, BUFFERS). Writes bench/out/backlog_scan.json. Usage:
    .venv/bin/python bench/backlog_scan.py [--rows 300000] [--repeat 7]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import sqlalchemy as sa

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._setup import OUT, fresh_postgres

MODEL = "fleet-model"
COLUMNS = "model, status, deadline, prefix_key, batch_id, line"
INDEXES = {
    "before": f"CREATE INDEX ix_batch_requests_queue ON batch_requests ({COLUMNS})",
    "after": f"CREATE INDEX ix_batch_requests_queue ON batch_requests ({COLUMNS})"
    " INCLUDE (est_input_tokens, max_output_tokens)",
}


def old_backlog(session: Any, *, model: str) -> Any:
    """The read as it was before: every open job's sizes (grouped off the rows), summed."""
    from storage.planning.shapes import JobShape
    from storage.queue.backlog import open_jobs

    jobs = open_jobs(session, model=model)
    return JobShape(
        sum(j.shape.requests for j in jobs),
        sum(j.shape.input_tokens for j in jobs),
        sum(j.shape.output_tokens for j in jobs),
        model,
    )


def timed(read: Callable[[Any], Any], repeat: int) -> tuple[list[float], Any]:
    from storage.db import transaction

    seconds, answer = [], None
    for _ in range(repeat):
        began = time.perf_counter()
        with transaction() as session:
            answer = read(session)
        seconds.append(time.perf_counter() - began)
    return seconds, answer


def plan(read: Callable[[Any], Any]) -> list[str]:
    """EXPLAIN (ANALYZE, BUFFERS) of the statement `read` sends (the last one, for the old read)."""
    from storage.db import get_engine, transaction

    seen: list[tuple[str, Any]] = []

    def record(_c: Any, _cur: Any, statement: str, parameters: Any, _ctx: Any, _many: bool) -> None:
        seen.append((statement, parameters))

    sa.event.listen(get_engine(), "before_cursor_execute", record)
    try:
        with transaction() as session:
            read(session)
    finally:
        sa.event.remove(get_engine(), "before_cursor_execute", record)
    statement, parameters = seen[-1]
    with get_engine().connect() as conn:
        return [row[0] for row in conn.exec_driver_sql("EXPLAIN (ANALYZE, BUFFERS) " + statement, parameters)]


def admin(url: str, *statements: str) -> None:
    engine = sa.create_engine(url.replace("postgresql://", "postgresql+psycopg://"), isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        for statement in statements:
            conn.execute(sa.text(statement))
    engine.dispose()


def churn(url: str, share: float) -> int:
    """A share of the queued rows claimed and handed back (status moved there and back: new row versions, pages
    no longer all-visible), as claims and hand-backs leave a live queue between two VACUUMs; how many."""
    engine = sa.create_engine(url.replace("postgresql://", "postgresql+psycopg://"))
    with engine.begin() as conn:
        ids = [
            row[0]
            for row in conn.execute(
                sa.text("SELECT id FROM batch_requests TABLESAMPLE BERNOULLI (:pct)"), {"pct": share * 100}
            )
        ]
        for status in ("running", "queued"):
            conn.execute(
                sa.text("UPDATE batch_requests SET status = :s WHERE id = ANY(:ids)"), {"s": status, "ids": ids}
            )
    engine.dispose()
    return len(ids)


def figures(seconds: list[float]) -> dict[str, float]:
    return {"median_ms": round(statistics.median(seconds) * 1000, 2), "min_ms": round(min(seconds) * 1000, 2)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=300_000)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--churn", type=float, default=0.1, help="share of rows claimed and handed back")
    args = parser.parse_args()
    os.environ["BACKFILL_MODELS"] = json.dumps({MODEL: {"path": "fake:", "max_num_seqs": 384}})
    os.environ["BACKFILL_DATA_DIR"] = str(OUT / "backlog-scan-data")
    url = fresh_postgres("backfill_backlog_scan")
    assert url, "no Postgres"
    os.environ["BACKFILL_DATABASE_URL"] = url
    from bench.fleet import populate
    from storage.queue.backlog import backlog
    from storage.settings import get_settings
    from worker.cli.migrate import migrate_database

    migrate_database()
    populate(url, "long", args.rows)

    def new_read(session: Any) -> Any:
        return backlog(session, get_settings(), model=MODEL)

    def old_read(session: Any) -> Any:
        return old_backlog(session, model=MODEL)

    result: dict[str, Any] = {"rows": args.rows, "repeat": args.repeat, "cases": {}}
    cases = (("before", "before", old_read), ("after", "after", new_read))
    answers = {}
    for name, index, read in cases:
        admin(url, "DROP INDEX ix_batch_requests_queue", INDEXES[index], "VACUUM ANALYZE batch_requests")
        seconds, answers[name] = timed(read, args.repeat)
        result["cases"][name] = {**figures(seconds), "plan": plan(read)}
        print(name, result["cases"][name]["median_ms"], "ms", flush=True)
    from storage.queue.fleet_backlog import fleet_backlog

    def shared_read(session: Any) -> Any:  # what the other processes of the fleet read: the last sum's row
        return fleet_backlog(session, get_settings(), model=MODEL, max_age_seconds=3600)[0]

    timed(shared_read, 1)  # the first one sums and stores it
    seconds, answers["shared"] = timed(shared_read, args.repeat)
    result["cases"]["shared"] = {**figures(seconds), "plan": []}
    print("shared", result["cases"]["shared"]["median_ms"], "ms", flush=True)
    admin(url, "ALTER TABLE batch_requests SET (autovacuum_enabled = false)")  # the churn stays unvacuumed
    result["churned_rows"] = churn(url, args.churn)
    for name, index, read in (("before_churned", "before", old_read), ("after_churned", "after", new_read)):
        admin(url, "DROP INDEX ix_batch_requests_queue", INDEXES[index])
        seconds, answers[name] = timed(read, args.repeat)
        result["cases"][name] = {**figures(seconds), "plan": plan(read)}
        print(name, result["cases"][name]["median_ms"], "ms", flush=True)
    assert len({repr(a) for a in answers.values()}) == 1, answers
    result["answer"] = repr(answers["after"])
    result["ratio"] = round(result["cases"]["before"]["median_ms"] / result["cases"]["after"]["median_ms"], 1)
    result["ratio_churned"] = round(
        result["cases"]["before_churned"]["median_ms"] / result["cases"]["after_churned"]["median_ms"], 1
    )
    print(json.dumps({k: v for k, v in result.items() if k != "cases"}, indent=1))
    OUT.mkdir(exist_ok=True)
    (OUT / "backlog_scan.json").write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
