"""The worker's unit operations against a real database."""

from __future__ import annotations

import json

import pytest
from sqlalchemy import text

from storage.batches.batches import get_batch
from storage.db import get_engine, transaction
from tests.conftest import Backend
from tests.integration.jobs import chat, create_job, submit_job
from worker.process import service

pytestmark = pytest.mark.backfill_env({"BACKFILL_MODELS": json.dumps({"fake-model": {"path": "fake:"}})})


def _last_analyze() -> object:
    with get_engine().connect() as connection:
        return connection.execute(
            text("SELECT last_analyze FROM pg_stat_user_tables WHERE relname = 'batch_requests'")
        ).scalar()


def test_a_big_ingest_refreshes_the_queue_statistics_on_postgres(
    backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    if backend.name != "postgres":
        pytest.skip("planner statistics are a Postgres matter")
    monkeypatch.setattr(service, "ANALYZE_AFTER_ROWS", 20)
    before = _last_analyze()
    batch_id = create_job([chat(i) for i in range(25)])
    assert service.ingest(batch_id) == "in_progress"
    after = _last_analyze()
    assert after is not None and after != before


class BrokerDown:
    """A waker whose broker refuses every message (Redis is down)."""

    def send(self, task: str, kwargs: dict[str, object]) -> None:
        raise ConnectionRefusedError("redis://127.0.0.1:6379: connection refused")


def test_a_batch_whose_last_request_finishes_while_the_broker_is_down_is_finalized_by_the_gpu_worker(
    backend: Backend,
) -> None:
    from storage.wakeups import set_waker

    batch_id, _ = submit_job([chat(i) for i in range(3)])
    set_waker(BrokerDown())
    service.drop_runners()
    try:
        runner = service.get_runner("fake-model")
        while runner.run_for(1.0):  # its last flush calls request_finalize, which cannot wake the io worker
            pass
        service._finalizer.submit(lambda: None).result(timeout=30)  # the finalize queued behind it has run
    finally:
        service.drop_runners()  # runners are cached per model name: this registry must not leak into others
    with transaction() as session:
        assert get_batch(session, tenant_id=None, batch_id=batch_id).status == "completed"


def test_a_changed_model_spec_gets_a_new_engine_and_the_old_one_is_closed(
    backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The process keeps engines warm; a registry entry that changed (here max_num_seqs 8 -> 16) must not be
    # served by the engine built for the old entry (the e2e suite once ran a 16-slot test on an 8-slot engine).
    from tests.conftest import configure
    from worker.engine.fake import FakeEngine

    closed: list[int] = []
    monkeypatch.setattr(FakeEngine, "close", lambda self: closed.append(self.max_num_seqs))
    service.drop_runners()
    for slots in (8, 16):
        models = {"fake-model": {"path": "fake:", "max_num_seqs": slots}}
        configure(monkeypatch, {**backend.env, "BACKFILL_MODELS": json.dumps(models)})
        runner = service.get_runner("fake-model")
        assert runner.engine.max_num_seqs == slots
        assert service.get_runner("fake-model") is runner  # the same spec keeps its warm engine
    assert closed == [8]
    service.close_engines()


def test_a_cached_runner_whose_io_threads_were_closed_is_built_again_not_handed_out(backend: Backend) -> None:
    # A full e2e run once handed a live server's embedded worker a runner an earlier module had closed: every pass
    # failed with "the runner I/O threads ... are closed" and the test's batch sat queued for 300 s.
    service.drop_runners()
    try:
        runner = service.get_runner("fake-model")
        runner.close_io()
        again = service.get_runner("fake-model")
        assert again is not runner and not again.io.closed
        batch_id, _ = submit_job([chat(i) for i in range(3)])
        while again.run_for(1.0):
            pass
        with transaction() as session:
            assert get_batch(session, tenant_id=None, batch_id=batch_id).request_completed == 3
    finally:
        service.close_engines()


def test_a_cached_runner_built_under_other_settings_is_built_again_so_a_spend_cap_is_priced_as_configured(
    backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    # CI once ran a capped batch on a runner an earlier test had left warm under the default price book: its claim
    # priced the lines at $0, leased all 40 at once, and a $10 cap billed $160. The model spec was the same, so the
    # spec check kept the runner; the settings it claims and prices with were another test's.
    from storage.models import Batch
    from tests.conftest import configure

    prices = {"prices": [{"model": "fake-model", "effective_from": "2025-01-01", "input_usd_per_mtok": "0"}]}
    service.drop_runners()
    try:
        free = {**prices["prices"][0], "output_usd_per_mtok": "0"}
        configure(monkeypatch, {**backend.env, "BACKFILL_PRICE_BOOK": json.dumps({"prices": [free]})})
        stale = service.get_runner("fake-model")  # warm, under a price book where output is free
        dear = {**prices["prices"][0], "output_usd_per_mtok": "2000000"}  # one output token bills $1 (24h: 50% off)
        configure(monkeypatch, {**backend.env, "BACKFILL_PRICE_BOOK": json.dumps({"prices": [dear]})})
        runner = service.get_runner("fake-model")
        assert runner is not stale and runner.settings.price_book == service.get_settings().price_book
        batch_id, _ = submit_job([chat(i, max_tokens=4) for i in range(10)])  # $4 a line
        with transaction() as session:
            session.get_one(Batch, batch_id).max_cost_micro_usd = 10 * 1_000_000
        while runner.run_for(1.0):
            pass
        with transaction() as session:
            batch = get_batch(session, tenant_id=None, batch_id=batch_id)
            assert batch.request_completed <= 3  # $12 at most: one request past the $10 cap
            assert batch.request_failed == 10 - batch.request_completed  # the rest ended as budget_exceeded
    finally:
        service.close_engines()
