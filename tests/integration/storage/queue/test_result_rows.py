"""Numbering results for the `?after=` cursor (storage/queue/result_rows.py): chunk by chunk in short
transactions, each line numbered once, the cursor continuing where the last read stopped; SQLite and Postgres."""

from __future__ import annotations

import json
import threading

import pytest
from sqlalchemy import select, update

from storage.db import transaction
from storage.models import BatchRequest
from storage.queue.result_rows import number_results, numbered_pages
from tests.conftest import Backend
from tests.integration.jobs import chat, submit_job

pytestmark = pytest.mark.backfill_env({"BACKFILL_MODELS": json.dumps({"fake-model": {"path": "fake:"}})})


def finish(batch_id: str, lines: set[int]) -> None:
    """The worker records these requests' results (in whatever order they finished)."""
    with transaction() as session:
        session.execute(
            update(BatchRequest)
            .where(BatchRequest.batch_id == batch_id, BatchRequest.custom_id.in_(sorted(custom_ids(lines))))
            .values(status="completed", response_status=200, response_body={"ok": True})
        )


def read(batch_id: str, *, after: int) -> tuple[set[str], int]:
    """One cursor read as the route does it: number, then stream (after, upto]."""
    upto = number_results(batch_id=batch_id, chunk_rows=4)
    pages = numbered_pages(batch_id=batch_id, after=after, upto=upto, page_rows=3)
    return {row[1] for page in pages for row in page}, upto


def custom_ids(lines: set[int]) -> set[str]:
    return {f"r{line}" for line in lines}


def test_reads_number_in_chunks_and_the_cursor_returns_each_line_once(backend: Backend) -> None:
    batch_id, _ = submit_job([chat(i) for i in range(23)])
    rounds = [{1, 4, 9, 10, 15, 22}, {0, 2, 3, 5, 11, 12, 13, 14, 20, 21}, set(range(23))]
    cursor, seen, finished = 0, [], set()
    for lines in rounds:  # later rounds finish lines below ones an earlier read already numbered
        finish(batch_id, lines)
        finished |= lines
        got, cursor_next = read(batch_id, after=cursor)
        assert got == custom_ids(finished) - set().union(*seen)  # exactly what finished since the last read
        seen.append(got)
        cursor = cursor_next

    assert sum(len(got) for got in seen) == 23 and set().union(*seen) == custom_ids(set(range(23)))
    with transaction() as session:
        numbers = sorted(session.scalars(select(BatchRequest.result_seq).where(BatchRequest.batch_id == batch_id)))
    assert numbers == list(range(1, 24)) and cursor == 23  # each line numbered once, no gap
    assert read(batch_id, after=cursor) == (set(), 23)  # nothing new: the cursor stays


def test_two_readers_numbering_at_once_never_give_a_number_twice(backend: Backend) -> None:
    if backend.name != "postgres":
        pytest.skip("SQLite has one writer at a time")
    batch_id, _ = submit_job([chat(i) for i in range(120)])
    finish(batch_id, set(range(120)))
    tops: list[int] = []
    threads = [
        threading.Thread(target=lambda: tops.append(number_results(batch_id=batch_id, chunk_rows=7))) for _ in range(3)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    with transaction() as session:
        numbers = sorted(session.scalars(select(BatchRequest.result_seq).where(BatchRequest.batch_id == batch_id)))
    assert numbers == list(range(1, 121)) and max(tops) == 120
