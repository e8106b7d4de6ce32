"""A pause hands a batch's running requests back through their worker, with their tokens (issue 21 item 8): until
the holder hands them back no other worker can claim them, so a resume inside that window lets the holder go on
and no request is decoded by two workers. A row its own worker leases back (after the reaper re-queued it) runs
under the new claim from then on, so its checkpoints still land."""

from __future__ import annotations

import json
import threading

import pytest
from sqlalchemy import select

from storage.batches.control import pause_batch, resume_batch
from storage.db import transaction
from storage.models import Batch, BatchRequest
from storage.queue.claim import claim
from storage.queue.leases import release
from storage.queue.reaping import release_expired_leases
from storage.settings import get_settings
from tests.conftest import Backend
from tests.factories import expire_leases
from tests.integration.worker.feed.test_checkpoints import (
    StoppingEngine,
    answer,
    counter,
    finish,
    interrupt_after,
    rows_of,
    stored_of,
    uninterrupted,
)
from tests.integration.worker.feed.test_runner import enqueue
from worker.engine import EngineRequest, EngineResult
from worker.engine.fake import FakeEngine
from worker.feed.runner import Runner

pytestmark = pytest.mark.backfill_env(
    {
        "BACKFILL_MODELS": json.dumps({"fake-model": {"path": "fake:"}}),
        "BACKFILL_CHECKPOINT_EVERY_TOKENS": "8",
        "BACKFILL_CHECKPOINT_INTERVAL_SECONDS": "0.1",
    }
)


def control(batch_id: str, *verbs: str) -> None:
    with transaction() as session:
        tenant_id = session.get_one(Batch, batch_id).tenant_id
    for verb in verbs:
        with transaction() as session:
            (pause_batch if verb == "pause" else resume_batch)(session, tenant_id=tenant_id, batch_id=batch_id)


def other_worker_claims() -> list[str]:
    """What a second worker's claim finds now (its rows go back to the queue unrun)."""
    with transaction() as session:
        claimed = claim(
            session, model="fake-model", worker_id="w2", limit=16, lease_seconds=60, settings=get_settings()
        )
        release(session, worker_id="w2", request_ids=[item.id for item in claimed])
    return [item.id for item in claimed]


def other_worker_steps() -> int:
    """What a second worker decodes to finish the queue's work."""
    engine = FakeEngine("fake-model", max_num_seqs=4, max_model_len=10**9)
    finish(Runner(engine, model="fake-model", settings=get_settings(), worker_id="w2"))
    return engine.steps


def test_a_pause_and_a_resume_before_the_holders_renewal_leave_the_rows_to_it(backend: Backend) -> None:
    batch_id = enqueue(2, max_tokens=40)
    discarded_before = counter("discarded")
    first = interrupt_after(15)  # w1 is 15 tokens into both generations
    control(batch_id, "pause", "resume")  # both inside w1's lease renewal interval

    assert other_worker_claims() == []  # the rows stayed leased to w1: no second worker starts them again
    finish(first)
    rows = rows_of(batch_id)
    assert [row.status for row in rows] == ["completed"] * 2
    assert [answer(row) for row in rows] == [uninterrupted(row) for row in rows]
    assert counter("discarded") == discarded_before


class AbortSignalling(StoppingEngine):
    """Stops after `steps` steps, and sets `aborted` when the runner aborts requests (a pause's hand-back)."""

    def __init__(self, steps: int) -> None:
        super().__init__(steps, step_seconds=0.002)
        self.aborted = threading.Event()

    def abort(self, request_ids: list[str]) -> None:
        super().abort(request_ids)
        if request_ids:
            self.aborted.set()


def test_a_pause_leaves_the_rows_to_their_holder_until_it_hands_them_back_with_their_tokens(backend: Backend) -> None:
    batch_id = enqueue(2, max_tokens=3000)
    engine = AbortSignalling(15)
    runner = Runner(engine, model="fake-model", settings=get_settings(), worker_id="w1")
    runner.run_for(60.0, stop=engine.stop)
    control(batch_id, "pause")
    assert all(row.status == "running" and row.lease_owner == "w1" for row in rows_of(batch_id))
    assert other_worker_claims() == []  # no claim of a paused batch

    runner.run_for(60.0, stop=engine.aborted)  # its next renewal learns of the pause: the engine is free
    runner.close_io()
    assert not runner.inflight
    rows = rows_of(batch_id)
    assert all(row.status == "queued" and row.lease_owner is None and row.attempts == 0 for row in rows)
    assert all(15 <= row.checkpoint_tokens == len(stored_of(row)) < 3000 for row in rows)
    control(batch_id, "resume")
    assert other_worker_steps() == 3000 - min(row.checkpoint_tokens for row in rows)  # not one token decoded twice
    done = rows_of(batch_id)
    assert [answer(row) for row in done] == [uninterrupted(row) for row in rows]


def test_a_dead_holders_paused_rows_go_back_when_its_lease_expires_and_run_after_the_resume(backend: Backend) -> None:
    batch_id = enqueue(2, max_tokens=40)
    first = interrupt_after(15)
    first.close_io()  # w1 dies holding both rows
    control(batch_id, "pause")
    assert other_worker_claims() == []
    with transaction() as session:
        expire_leases(session)
        assert release_expired_leases(session, max_attempts=3) == 2
    assert other_worker_claims() == []  # queued again, but paused
    control(batch_id, "resume")
    other_worker_steps()
    assert [row.status for row in rows_of(batch_id)] == ["completed"] * 2


class ReapedMidway(StoppingEngine):
    """At step `at`, the reaper re-queues the rows under the runner (a lease it could not renew in time) and the
    runner's own claimer leases them back before its renewal does: a re-lease, under a new claim."""

    def __init__(self, steps: int, *, at: int) -> None:
        super().__init__(steps)
        self.at = at
        self.feeding: Runner | None = None

    def step(self) -> list[EngineResult]:
        results = super().step()
        if self.steps == self.at and self.feeding is not None:
            with transaction() as session:
                expire_leases(session)
                release_expired_leases(session, max_attempts=5)
            self.feeding.io.request_claim(4, held=frozenset(self.feeding.held()))
            self.feeding.io.drain()  # the claim is done: the runner admits its rows at its next top-up
        return results


def test_a_row_its_own_worker_leased_back_keeps_storing_its_checkpoints(backend: Backend) -> None:
    batch_id = enqueue(2, max_tokens=60)
    engine = ReapedMidway(40, at=10)
    runner = Runner(engine, model="fake-model", settings=get_settings(), worker_id="w1")
    engine.feeding = runner
    runner.run_for(60.0, stop=engine.stop)
    with transaction() as session:
        claims = set(session.scalars(select(BatchRequest.claim_id).where(BatchRequest.batch_id == batch_id)))
    assert runner.hand_back(drain_seconds=0.0) == 2
    runner.close_io()
    rows = rows_of(batch_id)
    assert all(row.status == "queued" and row.claim_id in claims for row in rows)
    assert [row.checkpoint_tokens for row in rows] == [40, 40]  # the hand-back's write landed under the new claim
    for row in rows:
        reference = FakeEngine("fake-model", max_model_len=10**9)
        reference.add(EngineRequest(row.id, row.url, row.body))
        for _ in range(40):
            reference.step()
        assert stored_of(row) == reference.progress([row.id])[row.id].token_ids
    assert other_worker_steps() == 60 - 40
    assert [row.completion_tokens for row in rows_of(batch_id)] == [60, 60]


class ReapedThenPaused(ReapedMidway):
    """As ReapedMidway, and pauses the batch inside the step that finishes its requests (the chaos suite's seed 59:
    a result of a row its worker had leased back reached `record` paused)."""

    def __init__(self, *, at: int, batch_id: str) -> None:
        super().__init__(10**6, at=at)
        self.batch_id = batch_id

    def step(self) -> list[EngineResult]:
        results = super().step()
        if results:
            control(self.batch_id, "pause")
            self.stop.set()
        return results


def test_a_result_of_a_row_leased_back_that_its_pause_hands_back_keeps_its_tokens(backend: Backend) -> None:
    batch_id = enqueue(2, max_tokens=30)
    engine = ReapedThenPaused(at=5, batch_id=batch_id)
    runner = Runner(engine, model="fake-model", settings=get_settings(), worker_id="w1")
    engine.feeding = runner
    runner.run_for(60.0, stop=engine.stop)  # `record` hands both back: a paused batch makes no progress
    runner.close_io()
    rows = rows_of(batch_id)
    assert all(row.status == "queued" and row.response_body is None for row in rows)
    assert [row.checkpoint_tokens for row in rows] == [29, 29]  # all but the last token, under the new claim
    control(batch_id, "resume")
    assert other_worker_steps() == 1
    assert [answer(row) for row in rows_of(batch_id)] == [uninterrupted(row) for row in rows]
