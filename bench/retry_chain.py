"""What a retry and the merged view cost as a retry tree deepens (issue 36, item 1).

A batch of `--lines` lines runs its first 10% and is cancelled; then, `--depth` times, the newest attempt is
retried and cancelled before anything of it runs (each retry re-holds every failed line: the worst tree), and
after each retry the merged view of the original is read whole. Both are timed at every depth, on SQLite (the
embedded default) and on a fresh Postgres database; the ratio of the deepest to the first says whether the
cost grows with the tree. Prints a table and one JSON object:

    .venv/bin/python bench/retry_chain.py [--lines 5000] [--depth 10] [--backends sqlite,postgres]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lines", type=int, default=5000)
    parser.add_argument("--depth", type=int, default=10)
    parser.add_argument("--backends", default="sqlite,postgres")
    parser.add_argument("--one", choices=["sqlite", "postgres"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(_run(args.one, lines=args.lines, depth=args.depth)))
        return 0
    results = {}
    for backend in args.backends.split(","):  # each in its own process: settings are process-wide
        out = subprocess.run(
            [sys.executable, __file__, "--one", backend, "--lines", str(args.lines), "--depth", str(args.depth)],
            check=True,
            capture_output=True,
            text=True,
        )
        results[backend] = json.loads(out.stdout.strip().splitlines()[-1])
    for backend, rows in results.items():
        print(f"{backend}: depth  retry s  merged s")
        for row in rows["depths"]:
            print(f"{backend}: {row['depth']:5d}  {row['retry_s']:7.3f}  {row['merged_s']:8.3f}")
        print(f"{backend}: deepest / first: retry {rows['retry_ratio']:.2f}x, merged view {rows['merged_ratio']:.2f}x")
    print(json.dumps(results))
    return 0


def _run(backend: str, *, lines: int, depth: int) -> dict[str, Any]:
    os.environ.update(
        BACKFILL_DATA_DIR=tempfile.mkdtemp(prefix="bench-retry-chain-"),
        BACKFILL_MODELS=json.dumps({"backfill-demo": {"path": "fake:"}}),
        BACKFILL_RETRY_MAX_ATTEMPTS=str(max(depth, 1)),
    )
    if backend == "postgres":
        from bench._setup import fresh_postgres

        url = fresh_postgres("backfill_retry_chain")
        if url is None:
            raise SystemExit("no Postgres at 127.0.0.1:5432")
        os.environ["BACKFILL_DATABASE_URL"] = url
    from worker.cli.migrate import migrate_database

    migrate_database()
    from sqlalchemy import update

    from bench._setup import chat_line, submit
    from storage.db import transaction
    from storage.models import BatchRequest

    origin = submit(chat_line(i, 8) for i in range(lines))
    with transaction() as session:
        session.execute(
            update(BatchRequest)
            .where(BatchRequest.batch_id == origin, BatchRequest.line <= lines // 10)
            .values(status="completed", response_status=200, response_body={"ok": True}, finished_at=time.time())
        )
    _cancel(origin)
    rows, latest = [], origin
    for level in range(1, depth + 1):
        started = time.perf_counter()
        latest = _retry(latest)
        retry_s = time.perf_counter() - started
        started = time.perf_counter()
        count = _merged(origin)
        merged_s = time.perf_counter() - started
        assert count == lines, count
        rows.append({"depth": level, "retry_s": round(retry_s, 4), "merged_s": round(merged_s, 4)})
        _cancel(latest)
    return {
        "lines": lines,
        "depths": rows,
        "retry_ratio": rows[-1]["retry_s"] / rows[0]["retry_s"],
        "merged_ratio": rows[-1]["merged_s"] / rows[0]["merged_s"],
    }


def _tenant(batch_id: str) -> str:
    from storage.db import transaction
    from storage.models import Batch

    with transaction() as session:
        return session.get_one(Batch, batch_id).tenant_id


def _cancel(batch_id: str) -> None:
    from storage.batches.control import cancel_batch
    from storage.db import transaction
    from storage.files.blobs import get_blob_store
    from worker.jobs.finalize import finalize_batch

    with transaction() as session:
        cancel_batch(session, tenant_id=_tenant(batch_id), batch_id=batch_id)
    finalize_batch(get_blob_store(), batch_id=batch_id)


def _retry(batch_id: str) -> str:
    from storage.batches import retries
    from storage.db import transaction
    from storage.protocols import OPENAI
    from storage.settings import get_settings

    tenant = _tenant(batch_id)
    with transaction() as session:
        if hasattr(retries, "RetryChoices"):
            retry = retries.retry_batch(
                session,
                get_settings(),
                tenant_id=tenant,
                batch_id=batch_id,
                protocol=OPENAI,
                choices=retries.RetryChoices(),
            )
        else:  # the code before issue 36 (run this script in an older checkout to compare)
            retry = retries.retry_batch(session, tenant_id=tenant, batch_id=batch_id, protocol=OPENAI, codes=[])
        return retry.id


def _merged(batch_id: str) -> int:
    from storage.batches.results import merged_results
    from storage.db import transaction

    with transaction() as session:
        view = merged_results(session, tenant_id=_tenant(batch_id), batch_id=batch_id)
    return sum(1 for _ in view.lines)


if __name__ == "__main__":
    raise SystemExit(main())
