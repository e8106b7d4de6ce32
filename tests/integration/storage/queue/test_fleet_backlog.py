"""The backlog the fleet shares (storage/queue/fleet_backlog.py): one process sums the queue per interval, the others
read its sum; the urgency horizon it gives is the one each process's own sum gave."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest
from sqlalchemy import event, select, update

from storage.clock import now_f
from storage.db import get_engine, get_sessionmaker, transaction
from storage.models import ModelBacklog
from storage.queue.backlog import backlog, drain_seconds
from storage.queue.claim_order import HORIZON_MAX_AGE_SECONDS, drain_cache, urgency_horizon
from storage.queue.fleet_backlog import fleet_backlog
from storage.settings import Settings, get_settings
from tests.conftest import Backend
from tests.factories import make_batch, make_request, make_run, make_tenant

pytestmark = [
    pytest.mark.backfill_env({"BACKFILL_MODELS": json.dumps({"fake-model": {"path": "fake:"}})}),
    pytest.mark.parametrize("backend", ["postgres"], indirect=True),
]


@pytest.fixture(autouse=True)
def fresh_drain_cache() -> Iterator[None]:
    drain_cache.clear()
    yield
    drain_cache.clear()


def queue(rows: int) -> None:
    with transaction() as session:
        batch = make_batch(session, tenant=make_tenant(session))
        for _ in range(rows):
            make_request(session, batch=batch, status="queued", max_tokens=1000)


def backlog_sums(statements: list[str]) -> int:
    return sum(1 for s in statements if "FROM batch_requests" in s and "sum(" in s)


@pytest.fixture
def statements() -> Iterator[list[str]]:
    seen: list[str] = []

    def record(*args: object) -> None:
        seen.append(str(args[2]))

    event.listen(get_engine(), "before_cursor_execute", record)
    yield seen
    event.remove(get_engine(), "before_cursor_execute", record)


def test_the_fleet_horizon_is_the_one_each_process_summed_for_itself(backend: Backend, settings: Settings) -> None:
    with transaction() as session:
        make_run(session, busy_seconds=100.0, completion_tokens=1000)
    queue(72)
    with transaction() as session:
        own = settings.urgent_drain_multiple * drain_seconds(session, model="fake-model", settings=settings)
        shared = urgency_horizon(session, model="fake-model", settings=settings)
    assert shared == pytest.approx(own) and shared > settings.urgent_within_seconds


def test_other_processes_read_the_last_sum_instead_of_summing_the_queue(
    backend: Backend, statements: list[str]
) -> None:
    queue(5)
    with transaction() as session:
        first, age = fleet_backlog(session, get_settings(), model="fake-model", max_age_seconds=HORIZON_MAX_AGE_SECONDS)
    assert (first.requests, age) == (5, 0.0) and backlog_sums(statements) == 1
    queue(3)  # not seen until the sum is re-made
    for _ in range(4):  # four more processes within the interval
        with transaction() as session:
            shape, age = fleet_backlog(
                session, get_settings(), model="fake-model", max_age_seconds=HORIZON_MAX_AGE_SECONDS
            )
        assert shape == first and 0 < age < HORIZON_MAX_AGE_SECONDS
    assert backlog_sums(statements) == 1
    with transaction() as session:  # the interval is over: the next one sums again, and stores it
        session.execute(update(ModelBacklog).values(summed_at=now_f() - HORIZON_MAX_AGE_SECONDS))
    with transaction() as session:
        shape, age = fleet_backlog(session, get_settings(), model="fake-model", max_age_seconds=HORIZON_MAX_AGE_SECONDS)
        assert shape == backlog(session, get_settings(), model="fake-model") and shape.requests == 8 and age == 0.0
        stored = session.execute(select(ModelBacklog.requests, ModelBacklog.output_tokens)).one()
    assert tuple(stored) == (8, shape.output_tokens)


def test_while_one_process_re_sums_the_others_go_on_with_the_last_sum_without_waiting(backend: Backend) -> None:
    queue(5)
    with transaction() as session:
        fleet_backlog(session, get_settings(), model="fake-model", max_age_seconds=HORIZON_MAX_AGE_SECONDS)
        session.execute(update(ModelBacklog).values(summed_at=now_f() - HORIZON_MAX_AGE_SECONDS))
    queue(3)
    summing = get_sessionmaker()()  # a process that took the row to sum again, not committed yet
    try:
        summing.execute(select(ModelBacklog).with_for_update())
        began = time.monotonic()
        with transaction() as session:
            shape, age = fleet_backlog(
                session, get_settings(), model="fake-model", max_age_seconds=HORIZON_MAX_AGE_SECONDS
            )
        assert time.monotonic() - began < 1.0
        assert shape.requests == 5 and age >= HORIZON_MAX_AGE_SECONDS
    finally:
        summing.rollback()
        summing.close()
