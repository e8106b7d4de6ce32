"""The runner on the fake engine against a real database: continuous feeding, leases, exactly-once."""

from __future__ import annotations

import json
import threading
from collections.abc import Collection

import pytest
from sqlalchemy import func, select

from storage import lifecycle
from storage.batches.control import cancel_batch
from storage.db import transaction
from storage.files.blobs import get_blob_store
from storage.models import Batch, BatchRequest, EngineRun
from storage.queue.claim import claim
from storage.queue.reaping import release_expired_leases
from storage.queue.results import record
from storage.settings import get_settings
from tests.conftest import Backend
from tests.factories import expire_leases, make_batch, make_tenant
from worker.engine import EngineRequest, EngineResult
from worker.engine.fake import FakeEngine
from worker.feed.runner import Runner
from worker.jobs.finalize import finalize_batch

pytestmark = pytest.mark.backfill_env({"BACKFILL_MODELS": json.dumps({"fake-model": {"path": "fake:"}})})


def enqueue(n: int, *, tenant: str = "acme", max_tokens: int = 4, deadline_in: int = 3600) -> str:
    from storage.clock import now
    from storage.ids import new_id

    with transaction() as session:
        tenant_row = make_tenant(session, name=tenant)
        batch = make_batch(session, tenant=tenant_row, status=lifecycle.IN_PROGRESS, created_at=now())
        batch.request_total = n
        batch.expires_at = now() + deadline_in
        for i in range(n):
            body = {"model": "fake-model", "messages": [{"role": "user", "content": "x"}], "max_tokens": max_tokens}
            session.add(
                BatchRequest(
                    id=new_id("batch_req_"),
                    batch_id=batch.id,
                    tenant_id=tenant_row.id,
                    line=i + 1,
                    custom_id=f"r{i}",
                    model="fake-model",
                    url="/v1/chat/completions",
                    body=body,
                    status=lifecycle.REQ_QUEUED,
                    deadline=batch.expires_at,
                    attempts=0,
                )
            )
        return batch.id


def statuses(batch_id: str) -> dict[str, int]:
    with transaction() as session:
        rows = session.execute(
            select(BatchRequest.status, func.count())
            .where(BatchRequest.batch_id == batch_id)
            .group_by(BatchRequest.status)
        ).all()
    return {status: int(count) for status, count in rows}


def make_runner(max_num_seqs: int = 4, worker_id: str = "w1") -> Runner:
    engine = FakeEngine("fake-model", max_num_seqs=max_num_seqs, max_model_len=10**9)
    return Runner(engine, model="fake-model", settings=get_settings(), worker_id=worker_id)


def test_runner_keeps_every_slot_busy_while_work_is_queued(backend: Backend) -> None:
    batch_id = enqueue(40, max_tokens=10)
    runner = make_runner(max_num_seqs=4)
    while runner.run_for(5.0):
        pass
    assert statuses(batch_id) == {"completed": 40}
    with transaction() as session:
        run = session.scalars(select(EngineRun)).one()
        batch = session.get(Batch, batch_id)
        assert batch is not None and batch.request_completed == 40
    assert run.queued_steps > 0 and run.queued_running_seq_steps == run.queued_steps * 4
    assert run.completion_tokens == 400 and run.busy_seconds > 0


def test_a_result_for_a_lost_lease_is_dropped_and_the_request_runs_again(backend: Backend) -> None:
    batch_id = enqueue(3)
    with transaction() as session:
        claimed = claim(
            session, settings=get_settings(), model="fake-model", worker_id="dead-worker", limit=3, lease_seconds=5
        )
        expire_leases(session)
    assert len(claimed) == 3
    with transaction() as session:
        assert release_expired_leases(session, max_attempts=3) == 3
    runner = make_runner()
    while runner.run_for(5.0):
        pass
    # The dead worker comes back and reports: nothing it says is stored.
    from storage.queue.results import Outcome

    late = [Outcome(c.id, 200, {"late": True}, 1, 1, 0.1) for c in claimed]
    with transaction() as session:
        assert record(session, worker_id="dead-worker", run_id="run_x", outcomes=late) == {}
    finalize_batch(get_blob_store(), batch_id=batch_id)
    with transaction() as session:
        rows = list(session.scalars(select(BatchRequest).where(BatchRequest.batch_id == batch_id)))
        batch = session.get(Batch, batch_id)
    assert all(row.attempts == 2 and row.response_body != {"late": True} for row in rows)
    assert batch is not None and batch.status == "completed" and batch.request_completed == 3


def test_cancel_aborts_in_flight_requests_at_the_next_renewal(backend: Backend) -> None:
    batch_id = enqueue(20, max_tokens=10**8)  # never finishes on its own
    runner = make_runner(max_num_seqs=4)
    runner.run_for(0.3)
    assert statuses(batch_id).get("running", 0) == 8
    with transaction() as session:
        tenant_id = session.get(Batch, batch_id).tenant_id  # type: ignore[union-attr]
        cancel_batch(session, tenant_id=tenant_id, batch_id=batch_id)
    runner.run_for(3.0)
    assert not runner.inflight and not runner.engine.has_unfinished()
    assert statuses(batch_id) == {"cancelled": 20}


def test_tenants_share_claims_fairly(backend: Backend) -> None:
    big = enqueue(100, tenant="big")
    small = enqueue(5, tenant="small")
    with transaction() as session:
        claimed = claim(session, settings=get_settings(), model="fake-model", worker_id="w", limit=10, lease_seconds=30)
    by_batch = {batch_id: sum(1 for c in claimed if c.batch_id == batch_id) for batch_id in (big, small)}
    assert by_batch == {big: 5, small: 5}


def test_the_reaper_wakes_a_model_only_when_no_worker_is_on_it(backend: Backend) -> None:
    from worker.jobs.reaper import reap

    enqueue(10)
    with transaction() as session:
        assert reap(session).models_with_work == ["fake-model"]
    with transaction() as session:
        claim(session, settings=get_settings(), model="fake-model", worker_id="w", limit=2, lease_seconds=30)
    with transaction() as session:
        assert reap(session).models_with_work == []  # a live worker keeps claiming on its own


class _UrgencyRecordingEngine(FakeEngine):
    """The fake engine with shared mode's `set_urgent` hook, recording what the runner signals."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.signals: list[bool] = []

    def set_urgent(self, urgent: bool) -> None:
        self.signals.append(urgent)


def test_runner_tells_the_engine_while_work_near_its_deadline_is_in_flight(backend: Backend) -> None:
    relaxed = enqueue(4, tenant="relaxed", deadline_in=86_400)
    engine = _UrgencyRecordingEngine("fake-model", max_num_seqs=4, max_model_len=10**9)
    runner = Runner(engine, model="fake-model", settings=get_settings(), worker_id="w1")
    while runner.run_for(2.0):
        pass
    assert statuses(relaxed) == {"completed": 4}
    assert True not in engine.signals  # a day away is not urgent: no capacity is borrowed

    tight = enqueue(4, tenant="tight", deadline_in=60)  # inside the default 15-minute urgency horizon
    engine.signals.clear()
    while runner.run_for(2.0):
        pass
    assert statuses(tight) == {"completed": 4}
    assert engine.signals[0] is True and engine.signals[-1] is False  # borrowed, then given back
    assert not runner.ledger.urgent()


class _PreparedAheadEngine(FakeEngine):
    """The fake engine recording which thread `prepare`d each request, and which had been when `add`ed."""

    def __init__(self) -> None:
        super().__init__("fake-model", max_num_seqs=4, max_model_len=10**9)
        self.prepared_on: dict[str, str] = {}
        self.added: dict[str, bool] = {}

    def prepare(self, requests: Collection[EngineRequest]) -> None:
        self.prepared_on.update((r.request_id, threading.current_thread().name) for r in requests)

    def add(self, request: EngineRequest) -> EngineResult | None:
        self.added[request.request_id] = request.request_id in self.prepared_on
        return super().add(request)


def test_the_claimer_thread_has_every_claimed_row_prepared_before_the_engine_thread_adds_it(backend: Backend) -> None:
    batch_id = enqueue(12)
    engine = _PreparedAheadEngine()
    runner = Runner(engine, model="fake-model", settings=get_settings(), worker_id="w1")
    while runner.run_for(2.0):
        pass
    assert statuses(batch_id) == {"completed": 12}
    assert len(engine.added) == 12 and all(engine.added.values())  # rendered ahead, each of them
    assert set(engine.prepared_on.values()) == {"queue-claimer-fake-model"}  # off the engine's thread


class _FetchingEngine(FakeEngine):
    """The fake engine holding some requests as waiting for their inputs (a line's images on a slow server) until
    `release`: they are in flight but take no engine slot, as worker/engine/media.py's lines."""

    def __init__(self, slow: set[str]) -> None:
        super().__init__("fake-model", max_num_seqs=2, max_model_len=10**9)
        self.slow, self.held = slow, dict[str, EngineRequest]()

    def add(self, request: EngineRequest) -> EngineResult | None:
        if request.request_id in self.slow:
            self.held[request.request_id] = request
            return None
        return super().add(request)

    def waiting_for_inputs(self) -> int:
        return len(self.held)

    def has_unfinished(self) -> bool:
        return bool(self.held) or super().has_unfinished()

    def abort(self, request_ids: list[str]) -> None:
        for request_id in request_ids:
            self.held.pop(request_id, None)
        super().abort(request_ids)

    def release(self) -> None:
        held, self.held = list(self.held.values()), {}
        for request in held:
            super().add(request)


def test_lines_waiting_for_their_images_do_not_hold_the_engine_from_another_tenants_work(backend: Backend) -> None:
    slow = enqueue(4, tenant="slow-images", deadline_in=60)  # urgent: claimed first, filling every in-flight place
    quick = enqueue(4, tenant="quick")
    with transaction() as session:
        slow_ids = set(session.scalars(select(BatchRequest.id).where(BatchRequest.batch_id == slow)))
    engine = _FetchingEngine(slow_ids)
    runner = Runner(engine, model="fake-model", settings=get_settings(), worker_id="w1")
    for _ in range(20):
        runner.run_for(0.5)
        if statuses(quick) == {"completed": 4}:
            break
    assert statuses(quick) == {"completed": 4}  # it ran while the slow tenant's images were still on their way
    assert set(engine.held) == slow_ids and statuses(slow) == {"running": 4}
    engine.release()
    while runner.run_for(2.0):
        pass
    assert statuses(slow) == {"completed": 4}


class _HugeIntegerEngine(FakeEngine):
    """Answers the first request with a tool input holding an integer past 64 bits (a random model did: its JSON
    answer's number, parsed as Python parses JSON), and another past a float's range."""

    def _result(self, sequence):  # type: ignore[no-untyped-def]
        result = super()._result(sequence)
        if result.request_id == self.huge_id:
            result.body["choices"][0]["message"]["parsed"] = {"n": 10**30, "m": -(10**400), "ok": 7}
        return result


def test_an_answer_holding_an_integer_past_64_bits_is_stored_and_every_line_runs_on(backend: Backend) -> None:
    """Issue 37 corpus run: an Anthropic tool input with a 30-digit integer failed every write of the runner
    (orjson holds 64-bit integers), so the worker retried the same flush forever and no tenant's line landed."""
    batch_id = enqueue(6)
    other = enqueue(4, tenant="globex")
    engine = _HugeIntegerEngine("fake-model", max_num_seqs=4, max_model_len=10**9)
    with transaction() as session:
        engine.huge_id = session.scalars(  # type: ignore[attr-defined]
            select(BatchRequest.id).where(BatchRequest.batch_id == batch_id, BatchRequest.line == 1)
        ).one()
    runner = Runner(engine, model="fake-model", settings=get_settings(), worker_id="w1")
    while runner.run_for(5.0):
        pass
    assert statuses(batch_id) == {"completed": 6} and statuses(other) == {"completed": 4}
    with transaction() as session:
        stored = session.get(BatchRequest, engine.huge_id)  # type: ignore[attr-defined]
        assert stored is not None and stored.response_body is not None
        assert stored.response_body["choices"][0]["message"]["parsed"] == {"n": 1e30, "m": None, "ok": 7}


def test_rows_queued_between_two_calls_join_the_running_batch_at_the_start_of_the_next(backend: Backend) -> None:
    # The embedded loop ingests between calls: 8 jobs created together arrive a few at a time, and a call that waited
    # IDLE_CLAIM_SECONDS after the last short claim ran the engine half-empty meanwhile (bench/lora_packing.py).
    first = enqueue(2, tenant="acme", max_tokens=10**6)
    runner = make_runner(max_num_seqs=8)
    runner.engine.step_seconds = 0.01  # type: ignore[attr-defined]
    runner.run_for(0.05)  # the claim found 2 rows of the 16 it asked for: the queue was short
    assert statuses(first) == {"running": 2}
    second = enqueue(6, tenant="acme", max_tokens=10**6)
    runner.run_for(0.05)  # well inside IDLE_CLAIM_SECONDS of that short claim
    assert statuses(second) == {"running": 6}
    assert len(runner.inflight) == 8
    runner.hand_back(drain_seconds=0)
    runner.close_io()
