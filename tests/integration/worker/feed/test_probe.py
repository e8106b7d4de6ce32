"""What the worker counts: a re-claimed lease, a reaped lease, the engine's busy time and slots, ingest once."""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest
from prometheus_client import REGISTRY

from storage.db import transaction
from storage.files.blobs import get_blob_store
from storage.queue import results as leases_results
from storage.queue.claim import claim
from storage.settings import get_settings
from tests.conftest import Backend
from tests.factories import expire_leases
from tests.integration.jobs import chat, create_job
from tests.integration.worker.feed.test_runner import enqueue, make_runner
from worker.jobs.ingest import ingest_batch
from worker.jobs.reaper import reap
from worker.process import service

pytestmark = pytest.mark.backfill_env({"BACKFILL_MODELS": json.dumps({"fake-model": {"path": "fake:"}})})


def metric(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_a_lease_the_reaper_released_is_counted_and_its_next_claim_is_a_reclaim(backend: Backend) -> None:
    batch_id = enqueue(3)
    expired, reclaimed = (
        metric("backfill_lease_expiries_total"),
        metric("backfill_requests_reclaimed_total", model="fake-model"),
    )
    with transaction() as session:
        claim(session, settings=get_settings(), model="fake-model", worker_id="dead-worker", limit=3, lease_seconds=5)
        expire_leases(session)
    with transaction() as session:
        reap(session)
    assert metric("backfill_lease_expiries_total") - expired == 3
    runner = make_runner()
    busy = metric("backfill_engine_busy_seconds_total", model="fake-model")
    while runner.run_for(5.0):
        pass
    assert metric("backfill_requests_reclaimed_total", model="fake-model") - reclaimed == 3
    assert metric("backfill_engine_busy_seconds_total", model="fake-model") > busy
    assert metric("backfill_engine_max_num_seqs", model="fake-model") == 4
    assert metric("backfill_engine_inflight_requests", model="fake-model") == 0
    assert batch_id


def test_busy_time_on_metrics_adds_up_to_the_engine_runs_recorded_for_cost(backend: Backend) -> None:
    from sqlalchemy import func, select

    from storage.models import EngineRun

    enqueue(30, max_tokens=20)
    before = metric("backfill_engine_busy_seconds_total", model="fake-model")
    steps = metric("backfill_engine_steps_total", model="fake-model")
    runner = make_runner(max_num_seqs=4)
    while runner.run_for(5.0):
        pass
    with transaction() as session:
        busy, run_steps = session.execute(select(func.sum(EngineRun.busy_seconds), func.sum(EngineRun.steps))).one()
    assert metric("backfill_engine_busy_seconds_total", model="fake-model") - before == pytest.approx(busy, rel=1e-6)
    assert metric("backfill_engine_steps_total", model="fake-model") - steps == run_steps


def test_two_passes_over_one_new_batch_count_its_lines_once(backend: Backend) -> None:
    if backend.name != "postgres":
        pytest.skip("concurrent ingest passes wait on the batch row lock: a Postgres matter")
    batch_id = create_job([chat(i) for i in range(7)])
    enqueued = metric("backfill_ingest_lines_total", outcome="enqueued")
    start = threading.Barrier(2)

    def one_pass() -> None:
        start.wait()
        with transaction() as session:
            ingest_batch(session, get_blob_store(), get_settings(), batch_id=batch_id)

    passes = [threading.Thread(target=one_pass) for _ in range(2)]
    for thread in passes:
        thread.start()
    for thread in passes:
        thread.join()
    assert metric("backfill_ingest_lines_total", outcome="enqueued") - enqueued == 7
    assert service.ingest(batch_id) == "in_progress"  # a third, late pass counts nothing either
    assert metric("backfill_ingest_lines_total", outcome="enqueued") - enqueued == 7


def test_every_result_s_claim_to_commit_latency_is_observed_while_later_results_wait_for_the_writer(
    backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The probe, seeing one flush committed while the next is still with the writer thread, must keep the
    claim times of that next flush's requests (finished in the engine, not yet committed): every result's
    claim-to-commit latency is observed once."""
    from worker.feed import runner as runner_module
    from worker.feed import writes

    monkeypatch.setattr(runner_module, "FLUSH_RESULTS", 4)  # a flush per 4 results: several flushes
    enqueue(12, max_tokens=4)
    latency = metric("backfill_result_latency_seconds_count", model="fake-model")
    runner = make_runner(max_num_seqs=4)
    second_handed_over, records, submits = threading.Event(), [], []
    submit = runner.io.submit

    def counted_submit(**kwargs: Any) -> None:
        submit(**kwargs)
        submits.append(1)
        if len(submits) == 2:
            second_handed_over.set()

    def first_record_waits_for_the_second_flush(*args: Any, **kwargs: Any) -> Any:
        records.append(1)
        if len(records) == 1:  # bounded: if the runner waits for this commit first, the test shows it below
            second_handed_over.wait(timeout=10)
        return leases_results.record_outcomes(*args, **kwargs)

    monkeypatch.setattr(runner.io, "submit", counted_submit)
    monkeypatch.setattr(writes, "record_outcomes", first_record_waits_for_the_second_flush)
    while runner.run_for(5.0):
        pass
    runner.close_io()
    assert second_handed_over.is_set(), "the runner waited for the first commit: the interleaving was not exercised"
    assert metric("backfill_result_latency_seconds_count", model="fake-model") - latency == 12
