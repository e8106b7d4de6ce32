"""Generation checkpoints on the fake engine against a real database: a hand-back keeps the tokens generated so
far, the next claim continues from them (the answer is the uninterrupted one, with fewer decode steps), and
tokens are counted as discarded where a resume cannot be exact."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import pytest
from prometheus_client import REGISTRY
from sqlalchemy import select

from storage.batches.control import pause_batch, resume_batch
from storage.db import transaction
from storage.models import Batch, BatchRequest, CheckpointChunk, Lease
from storage.queue.checkpoints import stored_tokens, unpack_tokens
from storage.settings import get_settings
from tests.conftest import Backend
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


class StoppingEngine(FakeEngine):
    """A fake engine that sets `stop` after `steps` steps: the runner hands back after exactly that many tokens."""

    def __init__(self, steps: int, **kwargs: Any) -> None:
        super().__init__("fake-model", max_num_seqs=4, max_model_len=10**9, **kwargs)
        self.stop_after, self.stop = steps, threading.Event()

    def step(self) -> list[EngineResult]:
        results = super().step()
        if self.steps >= self.stop_after:
            self.stop.set()
        return results


def counter(name: str) -> float:
    return REGISTRY.get_sample_value(f"backfill_decode_tokens_{name}_total", {"model": "fake-model"}) or 0.0


def rows_of(batch_id: str) -> list[BatchRequest]:
    with transaction() as session:
        query = select(BatchRequest).where(BatchRequest.batch_id == batch_id).order_by(BatchRequest.line)
        return list(session.scalars(query))


def stored_of(row: BatchRequest) -> list[int]:
    with transaction() as session:
        return stored_tokens(session, request_id=row.id)


def uninterrupted(row: BatchRequest) -> dict[str, Any]:
    """What the same request answers when nothing interrupts it."""
    engine = FakeEngine("fake-model", max_model_len=10**9)
    assert engine.add(EngineRequest(row.id, row.url, row.body)) is None
    while engine.has_unfinished():
        if results := engine.step():
            return {key: value for key, value in results[0].body.items() if key != "created"}
    raise AssertionError("no result")


def answer(row: BatchRequest) -> dict[str, Any]:
    assert row.response_body is not None
    return {key: value for key, value in row.response_body.items() if key != "created"}


def finish(runner: Runner) -> None:
    while runner.run_for(5.0):
        pass
    runner.close_io()


def interrupt_after(steps: int, *, worker_id: str = "w1") -> Runner:
    engine = StoppingEngine(steps)
    runner = Runner(engine, model="fake-model", settings=get_settings(), worker_id=worker_id)
    runner.run_for(60.0, stop=engine.stop)
    return runner


def test_a_drained_generation_resumes_where_it_stopped_and_answers_as_if_never_interrupted(backend: Backend) -> None:
    batch_id = enqueue(3, max_tokens=40)
    resumed_before = counter("resumed")
    first = interrupt_after(15)
    assert first.hand_back(drain_seconds=0.0) == 3
    first.close_io()
    rows = rows_of(batch_id)
    assert all(row.status == "queued" and row.checkpoint_tokens == 15 and row.attempts == 0 for row in rows)

    engine = FakeEngine("fake-model", max_num_seqs=4, max_model_len=10**9)
    finish(Runner(engine, model="fake-model", settings=get_settings(), worker_id="w2"))
    done = rows_of(batch_id)
    assert [row.status for row in done] == ["completed"] * 3
    for before, after in zip(rows, done, strict=True):
        assert answer(after) == uninterrupted(before)  # same text, finish reason and usage
        assert after.completion_tokens == 40 and after.checkpoint_tokens == 0 and not stored_of(after)
    assert engine.steps == 40 - 15  # the 15 tokens each were not decoded again
    assert counter("resumed") - resumed_before == 3 * 15


def test_a_request_that_cannot_resume_exactly_restarts_and_its_tokens_count_as_discarded(backend: Backend) -> None:
    batch_id = enqueue(2, max_tokens=30)
    with transaction() as session:  # seeded sampling: the generator's position is not in the checkpoint
        for row in session.scalars(select(BatchRequest).where(BatchRequest.batch_id == batch_id)):
            row.body = {**row.body, "seed": 7}
    discarded_before = counter("discarded")
    first = interrupt_after(10)
    first.hand_back(drain_seconds=0.0)
    first.close_io()
    rows = rows_of(batch_id)
    assert all(row.status == "queued" and row.checkpoint_tokens == 0 and not stored_of(row) for row in rows)
    assert counter("discarded") - discarded_before == 2 * 10
    engine = FakeEngine("fake-model", max_num_seqs=4, max_model_len=10**9)
    finish(Runner(engine, model="fake-model", settings=get_settings(), worker_id="w2"))
    assert engine.steps == 30
    assert [answer(row) for row in rows_of(batch_id)] == [uninterrupted(row) for row in rows]


def wait_for(condition: Any, what: str, timeout: float = 60.0) -> None:
    until = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < until, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_a_paused_batch_keeps_the_tokens_its_worker_had_generated(backend: Backend) -> None:
    batch_id = enqueue(2, max_tokens=10**6)
    engine = FakeEngine("fake-model", max_num_seqs=4, max_model_len=10**9, step_seconds=0.002)
    runner = Runner(engine, model="fake-model", settings=get_settings(), worker_id="w1")
    runner.run_for(0.5)
    with transaction() as session:
        tenant_id = session.get(Batch, batch_id).tenant_id  # type: ignore[union-attr]
        pause_batch(session, tenant_id=tenant_id, batch_id=batch_id)
    # The runner's next renewal finds the batch paused: it aborts the rows and hands them back with what it generated.
    wait_for(lambda: runner.run_for(0.5) is not None and not runner.inflight, "the runner to let the rows go")
    runner.close_io()
    rows = rows_of(batch_id)
    assert all(row.status == "queued" and row.lease_owner is None for row in rows)
    assert all(row.checkpoint_tokens > 0 and len(stored_of(row)) == row.checkpoint_tokens for row in rows)
    with transaction() as session:
        resume_batch(session, tenant_id=tenant_id, batch_id=batch_id)
    # The checkpoint is the beginning of the uninterrupted generation (the fake's ids depend on the position).
    for row in rows:
        stored = stored_of(row)
        reference = FakeEngine("fake-model", max_model_len=10**9)
        reference.add(EngineRequest(row.id, row.url, row.body))
        for _ in range(len(stored)):
            reference.step()
        assert reference.progress([row.id])[row.id].token_ids == stored


def test_a_hand_back_right_after_a_pause_keeps_the_tokens_of_the_rows_the_pause_took(backend: Backend) -> None:
    """A SIGTERM that lands before the runner's next renewal noticed a pause (the chaos suite's seed 59)."""
    batch_id = enqueue(3, max_tokens=40)
    runner = interrupt_after(15)
    with transaction() as session:
        tenant_id = session.get(Batch, batch_id).tenant_id  # type: ignore[union-attr]
        pause_batch(session, tenant_id=tenant_id, batch_id=batch_id)
    assert runner.hand_back(drain_seconds=0.0) == 3  # still its rows: the pause leaves them to their holder
    runner.close_io()
    rows = rows_of(batch_id)
    assert all(row.status == "queued" and row.lease_owner is None for row in rows)
    assert [row.checkpoint_tokens for row in rows] == [15] * 3  # not one of the 15 tokens is decoded again


class PausingEngine(FakeEngine):
    """Pauses `batch_id` inside the step that finishes its requests: their results reach `record` paused."""

    def __init__(self, batch_id: str) -> None:
        super().__init__("fake-model", max_num_seqs=4, max_model_len=10**9)
        self.batch_id = batch_id

    def step(self) -> list[EngineResult]:
        results = super().step()
        if results:
            with transaction() as session:
                tenant_id = session.get(Batch, self.batch_id).tenant_id  # type: ignore[union-attr]
                pause_batch(session, tenant_id=tenant_id, batch_id=self.batch_id)
        return results


def test_a_result_finished_as_its_batch_was_paused_keeps_its_tokens_for_the_resume(backend: Backend) -> None:
    """The chaos suite's graceful runs: `record` hands back results of a paused batch unstored (a paused batch
    makes no progress), and the whole generation was decoded again after the resume."""
    batch_id = enqueue(2, max_tokens=20)
    runner = Runner(PausingEngine(batch_id), model="fake-model", settings=get_settings(), worker_id="w1")
    runner.run_for(5.0)
    runner.close_io()
    rows = rows_of(batch_id)
    assert all(row.status == "queued" and row.response_body is None for row in rows)
    assert [row.checkpoint_tokens for row in rows] == [19, 19]  # all but the last token
    with transaction() as session:
        tenant_id = session.get(Batch, batch_id).tenant_id  # type: ignore[union-attr]
        resume_batch(session, tenant_id=tenant_id, batch_id=batch_id)
    engine = FakeEngine("fake-model", max_num_seqs=4, max_model_len=10**9)
    finish(Runner(engine, model="fake-model", settings=get_settings(), worker_id="w2"))
    assert engine.steps == 1  # only the last token is decoded again
    assert [answer(row) for row in rows_of(batch_id)] == [uninterrupted(row) for row in rows]


@pytest.mark.parametrize("interval", ["0.1", "2"])  # shorter than the 2 s renewals (written alone), or with them
def test_a_long_generation_is_checkpointed_with_its_renewals_so_a_crash_loses_a_bounded_slice(
    backend: Backend, monkeypatch: pytest.MonkeyPatch, interval: str
) -> None:
    monkeypatch.setenv("BACKFILL_CHECKPOINT_INTERVAL_SECONDS", interval)
    get_settings.cache_clear()
    batch_id = enqueue(1, max_tokens=10**6)
    engine = FakeEngine("fake-model", max_num_seqs=4, max_model_len=10**9, step_seconds=0.002)
    runner = Runner(engine, model="fake-model", settings=get_settings(), worker_id="w1")
    wait_for(lambda: runner.run_for(0.5) and rows_of(batch_id)[0].checkpoint_tokens > 0, "a periodic checkpoint")
    runner.close_io()  # a crash: nothing handed back
    (row,) = rows_of(batch_id)
    assert row.status == "running" and len(stored_of(row)) == row.checkpoint_tokens
    generated = len(engine.progress([row.id])[row.id].token_ids)
    assert 8 <= row.checkpoint_tokens <= generated
    with transaction() as session:
        lease = session.get_one(Lease, row.lease_id)
    assert lease.expires_at > time.time()  # renewed all the same


def chunks_of(request_id: str) -> list[tuple[int, int]]:
    """(start, tokens) of each stored chunk of a row's checkpoint, in order."""
    with transaction() as session:
        query = select(CheckpointChunk.start, CheckpointChunk.token_ids).where(CheckpointChunk.request_id == request_id)
        rows = session.execute(query.order_by(CheckpointChunk.start)).all()
    return [(start, len(unpack_tokens(blob))) for start, blob in rows]


def test_a_generation_checkpointed_many_times_stores_each_token_once_and_resumes_exactly(backend: Backend) -> None:
    batch_id = enqueue(1, max_tokens=3000)
    (row,) = rows_of(batch_id)
    engine = FakeEngine("fake-model", max_num_seqs=4, max_model_len=10**9, step_seconds=0.001)
    first = Runner(engine, model="fake-model", settings=get_settings(), worker_id="w1")
    wait_for(lambda: first.run_for(0.2) is not None and len(chunks_of(row.id)) >= 3, "three periodic checkpoints")
    first.hand_back(drain_seconds=0.0)
    first.close_io()
    chunks = chunks_of(row.id)
    # End to end, no overlap, no gap: each write stored only what came after the one before.
    assert [start for start, _ in chunks] == [sum(size for _, size in chunks[:i]) for i in range(len(chunks))]
    (handed,) = rows_of(batch_id)
    assert handed.status == "queued" and handed.checkpoint_tokens == sum(size for _, size in chunks) < 3000
    reference = FakeEngine("fake-model", max_model_len=10**9)
    reference.add(EngineRequest(row.id, row.url, row.body))
    for _ in range(handed.checkpoint_tokens):
        reference.step()
    assert stored_of(handed) == reference.progress([row.id])[row.id].token_ids

    engine = FakeEngine("fake-model", max_num_seqs=4, max_model_len=10**9)
    finish(Runner(engine, model="fake-model", settings=get_settings(), worker_id="w2"))
    (done,) = rows_of(batch_id)
    assert answer(done) == uninterrupted(row) and engine.steps == 3000 - handed.checkpoint_tokens
    assert chunks_of(row.id) == []


def test_a_checkpoint_the_engine_cannot_continue_from_is_dropped_when_it_restarts(backend: Backend) -> None:
    batch_id = enqueue(2, max_tokens=40)
    first = interrupt_after(15)
    first.hand_back(drain_seconds=0.0)
    first.close_io()
    assert all(row.checkpoint_tokens == 15 for row in rows_of(batch_id))
    with transaction() as session:  # seeded sampling now: the engine restarts from token 0
        for row in session.scalars(select(BatchRequest).where(BatchRequest.batch_id == batch_id)):
            row.body = {**row.body, "seed": 7}
    discarded_before = counter("discarded")
    second = interrupt_after(5, worker_id="w2")
    second.close_io()  # a crash after 5 tokens: what it wrote is what the next claim finds
    rows = rows_of(batch_id)
    assert all(row.status == "running" and row.checkpoint_tokens == 0 for row in rows)
    assert [chunks_of(row.id) for row in rows] == [[], []]
    assert counter("discarded") - discarded_before == 2 * 15
