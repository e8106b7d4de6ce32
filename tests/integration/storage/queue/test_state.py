"""The queue's state as metrics read it: depths by tenant, the earliest deadline, EDF slack and requests at risk."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from sqlalchemy import func, select

from storage.clock import now
from storage.db import transaction
from storage.metrics.queue_state import QueueStateCollector
from storage.models import BatchRequest
from storage.queue.claim import claim
from storage.queue.claim_order import drain_cache
from storage.queue.state import deadline_state, finished_requests, oldest_queued, open_requests
from storage.settings import Settings, get_settings
from tests.conftest import Backend
from tests.integration.jobs import chat, submit_job

pytestmark = pytest.mark.backfill_env(
    {"BACKFILL_MODELS": json.dumps({"fake-model": {"path": "fake:"}}), "BACKFILL_METRICS_CACHE_SECONDS": "0"}
)


@pytest.fixture(autouse=True)
def fresh_drain_cache() -> Iterator[None]:
    drain_cache.clear()
    yield
    drain_cache.clear()


def work_of_batch(batch_id: str, prefill_weight: float) -> float:
    with transaction() as session:
        inputs, outputs = session.execute(
            select(func.sum(BatchRequest.est_input_tokens), func.sum(BatchRequest.max_output_tokens)).where(
                BatchRequest.batch_id == batch_id
            )
        ).one()
    return float(outputs) + prefill_weight * float(inputs)


def test_a_job_due_soon_is_at_risk_and_sets_the_slack_while_a_later_one_is_not(
    backend: Backend, settings: Settings
) -> None:
    soon, _ = submit_job([chat(i, max_tokens=50) for i in range(4)], tenant="acme", deadline=now() + 600)
    later, _ = submit_job([chat(i, max_tokens=100) for i in range(6)], tenant="globex", deadline=now() + 7200)
    at = float(now())
    with transaction() as session:
        state = deadline_state(session, model="fake-model", settings=settings, at=at)
        depths = {(status, count) for _, _, status, count in open_requests(session)}
        enqueued = oldest_queued(session)
    weight = float(settings.prefill_weight)
    first, second = work_of_batch(soon, weight), work_of_batch(later, weight)
    assert state.work_per_second == 1000.0  # nothing measured yet: the default rate
    assert state.at_risk == 4 and state.horizon_seconds == settings.urgent_within_seconds
    assert state.earliest_deadline is not None and state.earliest_deadline - at == pytest.approx(600, abs=2)
    expected = min(600 - first / 1000, 7200 - (first + second) / 1000)
    assert state.slack_seconds == pytest.approx(expected, abs=2)
    assert depths == {("queued", 4), ("queued", 6)}
    assert now() - enqueued["fake-model"] <= 5


def test_a_deadline_already_passed_shows_as_negative_slack(backend: Backend, settings: Settings) -> None:
    submit_job([chat(i) for i in range(3)], deadline=now() + 2)
    with transaction() as session:
        state = deadline_state(session, model="fake-model", settings=settings, at=float(now() + 60))
    assert state.slack_seconds is not None and state.slack_seconds < -55
    assert state.at_risk == 3


def test_the_collector_reports_running_and_queued_requests_by_tenant(backend: Backend, settings: Settings) -> None:
    submit_job([chat(i) for i in range(5)], tenant="acme")
    with transaction() as session:
        claim(session, settings=get_settings(), model="fake-model", worker_id="w1", limit=2, lease_seconds=60)
    families = {family.name: family for family in QueueStateCollector().collect()}
    samples = {
        (s.labels.get("tenant"), s.labels.get("state")): s.value for s in families["backfill_queue_requests"].samples
    }
    assert samples == {("acme", "queued"): 3.0, ("acme", "running"): 2.0}
    at_risk = families["backfill_requests_at_risk"].samples
    assert [(s.labels["model"], s.value) for s in at_risk] == [("fake-model", 0.0)]
    with transaction() as session:
        assert finished_requests(session) == [("fake-model", finished_requests(session)[0][1], 0, 0)]


def test_a_model_name_nobody_serves_never_becomes_a_label(backend: Backend, settings: Settings) -> None:
    for i in range(3):  # a client trying model names: each batch is refused at ingest
        _, status = submit_job([chat(0, model=f"made-up-{i}")])
        assert status == "failed"
    families = {family.name: family for family in QueueStateCollector().collect()}
    labels = {(s.labels["model"], s.labels["status"], s.value) for s in families["backfill_batches"].samples}
    assert labels == {("_other", "failed", 3.0)}
