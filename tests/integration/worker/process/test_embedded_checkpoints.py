"""`backfill serve` stopping (the embedded default's shutdown, as on SIGTERM) checkpoints its in-flight
generations; the next start resumes them and answers as if nothing had stopped."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import pytest
from prometheus_client import REGISTRY
from sqlalchemy import select

from storage.db import transaction
from storage.models import BatchRequest
from tests.conftest import Backend
from tests.integration.jobs import chat, submit_job
from worker.engine import EngineRequest
from worker.engine.fake import FakeEngine
from worker.process import service
from worker.process.embedded import EmbeddedWorker

MODELS = {"fake-model": {"path": "fake:", "max_num_seqs": 4, "extra": {"step_seconds": 0.002}}}
pytestmark = pytest.mark.backfill_env({"BACKFILL_MODELS": json.dumps(MODELS), "BACKFILL_WORKER_MODEL": "fake-model"})


def rows_of(batch_id: str) -> list[BatchRequest]:
    with transaction() as session:
        query = select(BatchRequest).where(BatchRequest.batch_id == batch_id).order_by(BatchRequest.line)
        return list(session.scalars(query))


def wait_for(condition: Callable[[], bool], what: str, timeout: float = 120.0) -> None:
    until = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < until, f"timed out waiting for {what}"
        time.sleep(0.05)


def uninterrupted(row: BatchRequest) -> dict[str, Any]:
    engine = FakeEngine("fake-model", max_num_seqs=4)
    assert engine.add(EngineRequest(row.id, row.url, row.body)) is None
    while not (results := engine.step()):
        pass
    return {key: results[0].body[key] for key in ("choices", "usage")}


def resumed_total() -> float:
    return REGISTRY.get_sample_value("backfill_decode_tokens_resumed_total", {"model": "fake-model"}) or 0.0


def test_stopping_serve_checkpoints_in_flight_generations_and_the_next_start_resumes_them(backend: Backend) -> None:
    batch_id, _ = submit_job([chat(i, max_tokens=1500) for i in range(2)])
    before = resumed_total()
    first = EmbeddedWorker(reap_interval_seconds=60)
    first.start()
    try:
        wait_for(lambda: {row.status for row in rows_of(batch_id)} == {"running"}, "the requests to run")
        [runner] = [r for r in service._runners() if r.model == "fake-model"]  # not a runner an earlier test left
        wait_for(lambda: len(runner.inflight) == 2 and runner.engine.steps >= 50, "some tokens")
    finally:
        first.shutdown()  # what `backfill serve` does on SIGTERM
        service.drop_runners()
    stopped = rows_of(batch_id)
    assert {row.status for row in stopped} == {"queued"}
    assert all(0 < row.checkpoint_tokens < 1500 for row in stopped)

    second = EmbeddedWorker(reap_interval_seconds=60)
    second.start()
    try:
        wait_for(lambda: {row.status for row in rows_of(batch_id)} == {"completed"}, "the batch to finish")
    finally:
        second.shutdown()
        service.drop_runners()
    for row in rows_of(batch_id):
        assert row.response_body is not None
        assert {key: row.response_body[key] for key in ("choices", "usage")} == uninterrupted(row)
    assert resumed_total() - before == sum(row.checkpoint_tokens for row in stopped)
