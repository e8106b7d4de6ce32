"""Retry trees (storage/batches/retries.py): a retry and the merged view cost what their lines cost, however many
retries the tree holds, and the tree is bounded; SQLite and Postgres, no worker (nothing of a retry runs)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from sqlalchemy import event, select, update

from storage.batches.control import cancel_batch
from storage.batches.results import merged_results
from storage.batches.retries import RetryChoices, retry_batch
from storage.db import get_engine, transaction
from storage.errors import RetryLimitReached
from storage.files.blobs import get_blob_store
from storage.models import Batch, BatchRequest
from storage.protocols import OPENAI
from storage.settings import get_settings
from tests.conftest import Backend
from tests.integration.jobs import chat, submit_job
from worker.jobs.finalize import finalize_batch

LINES = 120
pytestmark = pytest.mark.backfill_env(
    {"BACKFILL_MODELS": json.dumps({"fake-model": {"path": "fake:"}}), "BACKFILL_RETRY_MAX_ATTEMPTS": "6"}
)


def cancelled(batch_id: str) -> None:
    """Cancel the batch before anything of it runs, and finalize it (every queued line: batch_cancelled)."""
    with transaction() as session:
        tenant = session.scalar(select(Batch.tenant_id).where(Batch.id == batch_id))
        assert tenant is not None
        cancel_batch(session, tenant_id=tenant, batch_id=batch_id)
    finalize_batch(get_blob_store(), batch_id=batch_id)


def retried(batch_id: str) -> str:
    with transaction() as session:
        tenant = session.scalar(select(Batch.tenant_id).where(Batch.id == batch_id))
        assert tenant is not None
        retry = retry_batch(
            session, get_settings(), tenant_id=tenant, batch_id=batch_id, protocol=OPENAI, choices=RetryChoices()
        )
        return retry.id


def merged(batch_id: str) -> list[dict[str, Any]]:
    with transaction() as session:
        tenant = session.scalar(select(Batch.tenant_id).where(Batch.id == batch_id))
        assert tenant is not None
        view = merged_results(session, tenant_id=tenant, batch_id=batch_id, page_rows=50)
    return [json.loads(line) for line in view.lines]


class Work:
    """What the database did meanwhile: statements, and on SQLite its virtual machine's steps (in thousands), a
    count that depends on the rows read, not on the machine's speed."""

    def __init__(self) -> None:
        self.statements = 0
        self.steps = 0


@contextmanager
def measured() -> Iterator[Work]:
    work = Work()
    engine = get_engine()
    sqlite = engine.dialect.name == "sqlite"

    def on_statement(*_: object) -> None:
        work.statements += 1

    def on_checkout(dbapi_connection: Any, *_: object) -> None:
        if sqlite:
            dbapi_connection.set_progress_handler(lambda: setattr(work, "steps", work.steps + 1), 1000)

    engine.pool.dispose()  # every connection from here on is checked out under the counter
    event.listen(engine, "before_cursor_execute", on_statement)
    event.listen(engine.pool, "checkout", on_checkout)
    try:
        yield work
    finally:
        event.remove(engine, "before_cursor_execute", on_statement)
        event.remove(engine.pool, "checkout", on_checkout)
        engine.pool.dispose()


def test_a_retry_and_the_merged_view_cost_the_same_at_every_depth_of_a_chain(backend: Backend) -> None:
    """A 120-line batch that ran 20 lines, cancelled, then retried and cancelled again and again (each retry
    re-holds all 100 failed lines): the fifth retry and the merged view read what the first did."""
    origin, _ = submit_job([chat(i) for i in range(LINES)])
    with transaction() as session:  # the first 20 lines succeeded
        session.execute(
            update(BatchRequest)
            .where(BatchRequest.batch_id == origin, BatchRequest.custom_id.in_([f"r{i}" for i in range(20)]))
            .values(status="completed", response_status=200, response_body={"ok": True})
        )
    cancelled(origin)
    costs = []
    latest = origin
    for _ in range(5):
        with measured() as work:
            latest = retried(latest)  # a chain: each retry of the one before
            view = merged(origin)
        costs.append((work.statements, work.steps))
        cancelled(latest)
        assert len(view) == LINES and [line["custom_id"] for line in view] == [f"r{i}" for i in range(LINES)]
        assert sum(line["error"] is None for line in view) == 20
    first, last = costs[0], costs[-1]
    assert last[0] <= first[0]  # as many statements at the fifth retry as at the first
    assert last[1] <= first[1] * 1.25  # and (SQLite) as much work: it does not grow with the tree

    # Retrying the original reaches the newest attempts too, and the merged view of a retry shows its lines.
    with measured() as work:
        again = retried(origin)
    assert work.statements <= first[0]
    with transaction() as session:
        assert session.get(Batch, again).request_total == LINES - 20  # type: ignore[union-attr]
    cancelled(again)
    assert [line["custom_id"] for line in merged(again)] == [f"r{i}" for i in range(20, LINES)]


def test_a_tree_holds_at_most_the_configured_retries(backend: Backend) -> None:
    origin, _ = submit_job([chat(i) for i in range(3)])
    cancelled(origin)
    for _ in range(6):
        cancelled(retried(origin))
    with pytest.raises(RetryLimitReached, match="already holds 6 retries") as refused:
        retried(origin)
    assert refused.value.status == 409 and refused.value.code == "retry_limit_reached"
