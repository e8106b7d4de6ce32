"""How long the first `GET /v1/batches/{id}/results` after a big batch ended holds the batch's row lock.

A 50,000-line batch is ingested on a fresh Postgres database, every request is marked finished at once
(a response body of ~300 bytes each) and the batch completed; then the results are read the way the route
reads them (`results_so_far`, its transaction committed before the lines stream), while a probe thread
keeps taking the batch's row lock (`SELECT … FOR UPDATE`, as a worker recording results does) and notes
the longest wait. Prints one JSON object:

    .venv/bin/python bench/result_numbering.py [--lines 50000]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lines", type=int, default=50_000)
    args = parser.parse_args()
    from bench._setup import fresh_postgres

    url = fresh_postgres("backfill_numbering")
    if url is None:
        print("no Postgres at 127.0.0.1:5432", file=sys.stderr)
        return 1
    os.environ.update(
        BACKFILL_DATABASE_URL=url,
        BACKFILL_DATA_DIR=tempfile.mkdtemp(prefix="bench-numbering-"),
        BACKFILL_MODELS=json.dumps({"backfill-demo": {"path": "fake:"}}),
    )
    from worker.cli.migrate import migrate_database

    migrate_database()
    batch_id, tenant_id = _finished_batch(args.lines)
    return _measure(batch_id, tenant_id, args.lines)


def _finished_batch(lines: int) -> tuple[str, str]:
    from sqlalchemy import update

    from bench._setup import chat_line, submit
    from storage.db import transaction
    from storage.models import Batch, BatchRequest

    batch_id = submit(chat_line(i, 8) for i in range(lines))
    body = {"id": "chatcmpl-x", "object": "chat.completion", "choices": [{"message": {"content": "lorem " * 30}}]}
    with transaction() as session:
        session.execute(
            update(BatchRequest)
            .where(BatchRequest.batch_id == batch_id)
            .values(status="completed", response_status=200, response_body=body, finished_at=time.time())
        )
        batch = session.get_one(Batch, batch_id)
        batch.status = "completed"
        return batch_id, batch.tenant_id


def _measure(batch_id: str, tenant_id: str, lines: int) -> int:
    from sqlalchemy import select

    from storage.batches.results import results_so_far
    from storage.db import transaction
    from storage.models import Batch

    waits: list[float] = []
    done = threading.Event()

    def probe() -> None:  # a worker recording results takes the same lock (lock_batches_of)
        while not done.is_set():
            started = time.perf_counter()
            with transaction() as session:
                session.execute(select(Batch.id).where(Batch.id == batch_id).with_for_update()).all()
            waits.append(time.perf_counter() - started)
            time.sleep(0.01)

    thread = threading.Thread(target=probe, daemon=True)
    started = time.perf_counter()
    thread.start()
    with transaction() as session:
        view = results_so_far(session, tenant_id=tenant_id, batch_id=batch_id, after=None)
    numbered = time.perf_counter() - started
    count = sum(1 for _ in view.lines)
    read = time.perf_counter() - started
    done.set()
    thread.join()
    with transaction() as session:  # a second read: nothing new to number, nothing after the cursor
        again = results_so_far(session, tenant_id=tenant_id, batch_id=batch_id, after=view.next_after)
    figures = {
        "lines": lines,
        "lines_read": count,
        "next_after": view.next_after,
        "lines_after_cursor": sum(1 for _ in again.lines),
        "numbering_seconds": round(numbered, 2),
        "read_seconds": round(read, 2),
        "probe_lock_takes": len(waits),
        "longest_lock_wait_seconds": round(max(waits, default=0.0), 3),
    }
    print(json.dumps(figures))
    return 0 if count == lines else 1


if __name__ == "__main__":
    sys.exit(main())
