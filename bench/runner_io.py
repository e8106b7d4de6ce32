"""Backfill's own CPU per job, without a model: the runner fed from Postgres, its engine a fake that sleeps.

bench/engine.py's overhead job (N chat requests x T output tokens, max_num_seqs 64) through the real runner,
its I/O threads and Postgres, with `FakeEngine` standing in for vLLM: each step sleeps `--step-ms` (the demo
model's step is 8-10 ms on 2 cores) and decodes one token per running request. What is left is Backfill's
work: CPU seconds of the engine thread (the runner's bookkeeping; the fake's own work is small), the writer
and claimer threads and this run's Postgres backends, and the statements each thread sent (by kind), per
round. On the 2-core bench machine every one of these CPU seconds is taken from the real engine, and they
are far steadier than wall-clock ratios on a shared machine, so this is the figure to compare changes by.

Usage: .venv/bin/python bench/runner_io.py [--requests 1000] [--tokens 64] [--rounds 3] [--step-ms 9] [--flush-seconds 0.5]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import tempfile
import threading
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._setup import OUT, chat_line, fresh_postgres

MODEL = "backfill-demo"


def prepare(database: str, *, max_num_seqs: int, step_ms: float) -> None:
    """A fresh data dir, this run's database and a registry whose model is the sleeping fake."""
    OUT.mkdir(exist_ok=True)
    os.environ["BACKFILL_DATA_DIR"] = tempfile.mkdtemp(prefix="bench-io-", dir=OUT)
    os.environ["BACKFILL_DATABASE_URL"] = database
    spec = {"path": "fake:sleeping", "max_num_seqs": max_num_seqs, "extra": {"step_seconds": step_ms / 1000}}
    os.environ["BACKFILL_MODELS"] = json.dumps({MODEL: spec})
    from worker.cli.migrate import migrate_database

    migrate_database()


class Statements:
    """Statements sent to the database, by thread and by kind (the statement's verb and first table), and the
    CPU time their Postgres backend spent on each kind (nanoseconds from /proc/<pid>/schedstat around each)."""

    def __init__(self) -> None:
        self.counts: dict[str, Counter[str]] = defaultdict(Counter)
        self.backend_ms: Counter[str] = Counter()
        self.enabled = False
        self._started: dict[int, int] = {}

    def listen(self) -> None:
        from sqlalchemy import event

        from storage.db import get_engine

        engine = get_engine()
        event.listen(engine, "before_cursor_execute", self._before)
        event.listen(engine, "after_cursor_execute", self._after)
        event.listen(engine, "commit", lambda conn: self._note("COMMIT"))
        engine.dispose()  # connections made from now on learn their backend's pid
        event.listen(engine.pool, "connect", _learn_backend_pid)

    def _before(self, conn: Any, cursor: Any, statement: str, params: Any, context: Any, many: bool) -> None:
        self._note(_kind(statement))
        if self.enabled and (pid := conn.connection.dbapi_connection.info.backend_pid):
            self._started[id(conn)] = _cpu_ns(pid)

    def _after(self, conn: Any, cursor: Any, statement: str, params: Any, context: Any, many: bool) -> None:
        started = self._started.pop(id(conn), None)
        if self.enabled and started is not None:
            thread = threading.current_thread().name.split("-")[1] if "-" in threading.current_thread().name else "main"
            self.backend_ms[f"{thread}: {_kind(statement)}"] += (
                _cpu_ns(conn.connection.dbapi_connection.info.backend_pid) - started
            ) / 1e6

    def _note(self, kind: str) -> None:
        if self.enabled:
            self.counts[threading.current_thread().name][kind] += 1

    def take(self) -> dict[str, Any]:
        counts, self.counts = self.counts, defaultdict(Counter)
        backend, self.backend_ms = self.backend_ms, Counter()
        by_thread = {thread: dict(sorted(kinds.items())) for thread, kinds in sorted(counts.items())}
        return {**by_thread, "backend_cpu_ms": {kind: round(ms, 1) for kind, ms in backend.most_common()}}


def _learn_backend_pid(dbapi_connection: Any, record: Any) -> None:
    record.info["pid"] = dbapi_connection.info.backend_pid


def _cpu_ns(pid: int) -> int:
    """Nanoseconds process `pid` has run on a CPU (the scheduler's own count, not rounded to clock ticks)."""
    try:
        return int(Path(f"/proc/{pid}/schedstat").read_text().split()[0])
    except OSError:
        return 0


def _kind(statement: str) -> str:
    words = statement.split()
    verb = words[0].upper() if words else "?"
    if verb == "WITH":
        verb = "WITH"
    table = re.search(r"\b(?:FROM|INTO|UPDATE)\s+([a-z_]+)", statement, re.IGNORECASE)
    return f"{verb} {table.group(1) if table else ''}".strip()


def one_round(index: int, requests: int, tokens: int, database: str, statements: Statements) -> dict[str, Any]:
    """One job: uploaded and enqueued, then measured from the runner's first claim to its last result
    committed (the engine clock of bench/engine.py), then its output file built and checked."""
    from bench.engine import fetch_output, submit_via_api
    from bench.engine_profile import cpu_of
    from worker.process import service

    lines = [chat_line(i, tokens) for i in range((index + 1) * 10**6, (index + 1) * 10**6 + requests)]
    runner = service.get_runner(MODEL)
    batch_id = submit_via_api(lines)
    measured: dict[str, Any] = {}
    statements.enabled = True
    with cpu_of(database, measured):
        while runner.run_for(30.0):
            pass
    statements.enabled = False
    fetch_output(batch_id, len(lines))
    cpu = {k: v for k, v in measured["cpu_s"].items() if v}
    return {"clock_seconds": round(measured["wall_s"], 3), "cpu_s": cpu, "statements": statements.take()}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--max-num-seqs", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--step-ms", type=float, default=9.0, help="how long each fake engine step sleeps")
    parser.add_argument("--flush-seconds", type=float, default=None, help="the runner's result flush interval")
    args = parser.parse_args()
    if args.flush_seconds is not None:
        from worker.feed import runner as runner_module

        runner_module.FLUSH_SECONDS = args.flush_seconds
    database = fresh_postgres("backfill_bench_io")
    if database is None:
        raise SystemExit("no Postgres at 127.0.0.1:5432")
    prepare(database, max_num_seqs=args.max_num_seqs, step_ms=args.step_ms)
    from bench.engine import run_backfill

    statements = Statements()
    statements.listen()
    run_backfill([chat_line(i, 8) for i in range(64)])  # warm: connections, caches, the API client
    rounds = [one_round(i, args.requests, args.tokens, database, statements) for i in range(args.rounds)]
    threads = sorted({name for r in rounds for name in r["cpu_s"]})
    medians = {name: round(statistics.median(r["cpu_s"].get(name, 0.0) for r in rounds), 3) for name in threads}
    result = {"requests": args.requests, "tokens": args.tokens, "step_ms": args.step_ms, "cpu_s_median": medians}
    result["flush_seconds"] = args.flush_seconds
    result["rounds"] = rounds
    print(json.dumps(result, indent=2))
    (OUT / "runner_io.json").write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
