"""A model's open backlog (storage/queue/backlog.py `backlog`): one sum off the queue index, with the very answer the
per-job sum it replaced gave, on both backends."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from sqlalchemy import event, text
from sqlalchemy.orm import Session

from storage import lifecycle
from storage.db import get_engine, transaction
from storage.models import BatchRequest
from storage.planning.shapes import JobShape
from storage.queue.backlog import backlog, open_jobs
from storage.settings import get_settings
from tests.conftest import Backend
from tests.factories import make_batch, make_request, make_tenant

STATUSES = (*sorted(lifecycle.REQ_OPEN), *sorted(lifecycle.REQ_TERMINAL))


def summed_jobs(session: Session, *, model: str) -> JobShape:
    """The backlog as it was read before: every open job's sizes (`open_jobs`, which reads the rows), summed."""
    jobs = open_jobs(session, model=model)
    return JobShape(
        sum(j.shape.requests for j in jobs),
        sum(j.shape.input_tokens for j in jobs),
        sum(j.shape.output_tokens for j in jobs),
        model,
    )


def fill(session: Session) -> None:
    """Two tenants' batches of two models, rows in every status, of varied sizes (one open row sized 0 by 0)."""
    sizes = itertools.cycle([(0, 0), (17, 4), (230, 1000), (5, 256), (1, 1)])
    for tenant_name, model in itertools.product(("acme", "globex"), ("fake-model", "other-model")):
        tenant = make_tenant(session, tenant_name)
        for _ in range(2):
            batch = make_batch(session, tenant=tenant, model=model)
            for status in STATUSES * 3:
                row = make_request(session, batch=batch, status=status)
                row.est_input_tokens, row.max_output_tokens = next(sizes)
    session.flush()


def test_the_backlog_is_the_sum_of_the_open_jobs_it_replaced(backend: Backend) -> None:
    with transaction() as session:
        fill(session)
    with transaction() as session:
        for model in ("fake-model", "other-model"):
            assert backlog(session, get_settings(), model=model) == summed_jobs(session, model=model)
            assert (
                backlog(session, get_settings(), model=model).requests == 2 * 2 * 2 * 3
            )  # tenants x batches x open statuses x 3
        assert backlog(session, get_settings(), model="no-such-model") == summed_jobs(session, model="no-such-model")
        assert backlog(session, get_settings(), model="no-such-model") == JobShape(0, 0, 0, "no-such-model")


def test_the_backlog_follows_rows_as_they_end_and_come_back(backend: Backend) -> None:
    with transaction() as session:
        fill(session)
    with transaction() as session:  # every running row ends, then one finished row is queued again
        session.execute(text("UPDATE batch_requests SET status = 'completed' WHERE status = 'running'"))
        session.execute(
            text(
                "UPDATE batch_requests SET status = 'queued' WHERE id = (SELECT min(id) FROM batch_requests WHERE status = 'failed')"
            )
        )
    with transaction() as session:
        for model in ("fake-model", "other-model"):
            assert backlog(session, get_settings(), model=model) == summed_jobs(session, model=model)


@contextmanager
def statements() -> Iterator[list[tuple[str, Any]]]:
    seen: list[tuple[str, Any]] = []

    def record(_conn: Any, _cursor: Any, statement: str, parameters: Any, _context: Any, _many: bool) -> None:
        seen.append((statement, parameters))

    event.listen(get_engine(), "before_cursor_execute", record)
    try:
        yield seen
    finally:
        event.remove(get_engine(), "before_cursor_execute", record)


def multiply(copies: int) -> None:
    """Every row `copies` times more (new ids and custom_ids, the same batches, statuses and sizes), in one
    statement: enough rows that the planner's choice follows from what each index holds, not from a tiny table."""
    columns = [column.name for column in BatchRequest.__table__.columns]
    replaced = {"id": "r.id || '-' || g", "custom_id": "r.custom_id || '-' || g"}
    picked = ", ".join(replaced.get(name, f"r.{name}") for name in columns)
    with transaction() as session:
        session.execute(
            text(
                f"INSERT INTO batch_requests ({', '.join(columns)}) "
                f"SELECT {picked} FROM batch_requests r, generate_series(1, :copies) g"
            ),
            {"copies": copies},
        )


@pytest.mark.parametrize("backend", ["postgres"], indirect=True)
def test_the_backlog_is_read_off_the_queue_index_alone(backend: Backend) -> None:
    with transaction() as session:
        fill(session)
    multiply(200)
    with statements() as seen, transaction() as session:
        expected = summed_jobs(session, model="fake-model")
        assert backlog(session, get_settings(), model="fake-model") == expected
    statement, parameters = seen[-1]
    with get_engine().connect() as conn:
        # Statistics and the visibility map as autovacuum would leave them, set here so that the plan does not
        # depend on whether it has run yet. Scans of the heap stay off (on 19,000 rows a sum of 1 in 6 of them
        # could still go either way); plain index scans stay on: turning them off adds the same penalty to
        # index-only scans, and the plan would then be a toss-up between two penalized ones.
        conn.execution_options(isolation_level="AUTOCOMMIT").execute(text("VACUUM ANALYZE batch_requests"))
        conn.execute(text("SET enable_seqscan = off"))
        conn.execute(text("SET enable_bitmapscan = off"))
        plan = "\n".join(row[0] for row in conn.exec_driver_sql("EXPLAIN " + statement, parameters))
    assert "Index Only Scan using ix_batch_requests_queue " in plan, plan
