"""A worker serving two models through one engine slot, on fake engines against a real database."""

from __future__ import annotations

import json
import logging
import time

import pytest
from sqlalchemy import func, select

from storage import lifecycle
from storage.clock import now, now_f
from storage.db import transaction
from storage.ids import new_id
from storage.models import BatchRequest
from storage.planning.shapes import request_size
from storage.settings import Settings, get_settings
from tests.conftest import Backend
from tests.factories import make_batch, make_run, make_tenant
from worker.engine import Engine
from worker.engine.factory import load_engine
from worker.engine.fake import FakeEngine
from worker.feed.slot import EngineSlot
from worker.process import service, tasks

A, B = "model-a", "model-b"
FAKE = {"path": "fake:", "max_num_seqs": 4, "extra": {"step_seconds": 0.005}}

pytestmark = pytest.mark.backfill_env(
    {
        "BACKFILL_MODELS": json.dumps({A: FAKE, B: FAKE}),
        "BACKFILL_WORKER_MODELS": f"{A},{B}",
        "BACKFILL_SWITCH_CHECK_SECONDS": "1",
        "BACKFILL_SWITCH_MIN_RESIDENCY_SECONDS": "0",
        "BACKFILL_SWITCH_RELOAD_SECONDS": "5",
        "BACKFILL_SWITCH_DRAIN_SECONDS": "0",  # hand in-flight work straight back: the harder path
    }
)


class ClosableFake(FakeEngine):
    """A fake engine that reports its load and close, so tests can see one engine at a time."""

    def __init__(self, events: list[tuple[str, str]], **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.events = events
        events.append(("load", self.model_name))

    def close(self) -> None:
        self.events.append(("close", self.model_name))


def make_slot(events: list[tuple[str, str]]) -> EngineSlot:
    def load(settings: Settings, model: str) -> Engine:
        plain = load_engine(settings, model)
        assert isinstance(plain, FakeEngine)
        return ClosableFake(
            events,
            model_name=model,
            max_num_seqs=plain.max_num_seqs,
            max_model_len=plain.max_model_len,
            step_seconds=plain.step_seconds,
        )

    settings = get_settings()
    return EngineSlot(settings.current_worker_models(), settings, load=load)


def enqueue(model: str, n: int, *, deadline_in: int, max_tokens: int = 10) -> str:
    with transaction() as session:
        tenant = make_tenant(session, name="acme")
        batch = make_batch(session, tenant=tenant, model=model, created_at=now())
        batch.request_total = n
        batch.expires_at = now() + deadline_in
        for i in range(n):
            body = {"model": model, "messages": [{"role": "user", "content": "x"}], "max_tokens": max_tokens}
            size_in, size_out = request_size("/v1/chat/completions", body, line_bytes=len(json.dumps(body)) + 60)
            session.add(
                BatchRequest(
                    id=new_id("batch_req_"),
                    batch_id=batch.id,
                    tenant_id=tenant.id,
                    line=i + 1,
                    custom_id=f"{model}-{i}",
                    model=model,
                    url="/v1/chat/completions",
                    body=body,
                    status=lifecycle.REQ_QUEUED,
                    deadline=batch.expires_at,
                    attempts=0,
                    est_input_tokens=size_in,  # sized as ingest sizes every line
                    max_output_tokens=size_out,
                )
            )
        return batch.id


def serve_until_idle(slot: EngineSlot, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while slot.serve_for(2.0):
        assert time.monotonic() < deadline, "the slot never went idle"


def outcome(batch_id: str) -> tuple[dict[str, int], set[int], float]:
    """(requests by status, attempts seen, when the last one finished)."""
    with transaction() as session:
        rows = session.execute(
            select(BatchRequest.status, BatchRequest.attempts, func.count(), func.max(BatchRequest.finished_at))
            .where(BatchRequest.batch_id == batch_id)
            .group_by(BatchRequest.status, BatchRequest.attempts)
        ).all()
    statuses: dict[str, int] = {}
    for status, _, count, _ in rows:
        statuses[status] = statuses.get(status, 0) + int(count)
    return statuses, {int(r[1]) for r in rows}, max(float(r[3] or 0) for r in rows)


def test_the_worker_switches_to_the_other_model_when_the_loaded_models_queue_empties(
    backend: Backend, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="worker.feed.slot")
    first = enqueue(A, 30, deadline_in=3600)
    second = enqueue(B, 30, deadline_in=7200)
    events: list[tuple[str, str]] = []
    slot = make_slot(events)

    serve_until_idle(slot)

    assert events == [("load", A), ("close", A), ("load", B)]  # one engine at a time
    assert [(s.unloaded, s.loaded, s.rule) for s in slot.switches] == [(None, A, "load"), (A, B, "drained")]
    for batch_id in (first, second):
        assert outcome(batch_id)[:2] == ({"completed": 30}, {1})
    assert f"model switching [drained]: {A} has no queued work; switching to {B} (30 requests" in caplog.text
    assert f"model switch: {A} -> {B} [drained]" in caplog.text
    assert slot.decisions[-1].action == "idle"


def test_the_worker_leaves_a_busy_model_early_when_the_other_models_deadline_is_at_risk(
    backend: Backend, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="worker.feed.slot")
    with transaction() as session:  # history: both models have run at 10 tokens/s on this node
        for model in (A, B):
            make_run(session, model=model, busy_seconds=1000.0, completion_tokens=10_000, started_at=now_f() - 2000)
    slow = enqueue(A, 200, deadline_in=86400)  # ~5 min of work at the measured rate, ~2.5 s of fake steps
    events: list[tuple[str, str]] = []
    slot = make_slot(events)
    slot.serve_for(0.5)
    assert slot.model == A
    urgent = enqueue(B, 10, deadline_in=150)  # ~15 s of work: it cannot wait for A's ~5 min

    serve_until_idle(slot)

    rules = [(s.unloaded, s.loaded, s.rule) for s in slot.switches]
    assert rules == [(None, A, "load"), (A, B, "deadline"), (B, A, "drained")]
    assert slot.switches[1].requeued > 0  # A's in-flight requests went back to the queue unrun
    assert events == [("load", A), ("close", A), ("load", B), ("close", B), ("load", A)]
    slow_statuses, slow_attempts, slow_done = outcome(slow)
    urgent_statuses, urgent_attempts, urgent_done = outcome(urgent)
    # Every request ran exactly once: a re-queued request's attempt was handed back, not counted.
    assert (slow_statuses, slow_attempts) == ({"completed": 200}, {1})
    assert (urgent_statuses, urgent_attempts) == ({"completed": 10}, {1})
    assert urgent_done < slow_done
    assert f"{B}'s deadline in 2 min is at risk: {A}'s " in caplog.text
    assert f"; switching to {B}" in caplog.text


def test_a_wake_up_for_either_model_runs_the_shared_slot(backend: Backend) -> None:
    batch_id = enqueue(A, 12, deadline_in=3600)
    service.drop_runners()
    try:
        while tasks.batch_run(model=B):  # B's queue is empty: the slot still serves A's work
            pass
        assert service.get_slot().model == A
        assert outcome(batch_id)[0] == {"completed": 12}
    finally:
        service.drop_runners()
