"""The runner's database I/O on threads of its own: every result committed exactly once, whatever fails, and no
row left leased to the worker without running."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import select

from storage.db import transaction
from storage.files.blobs import get_blob_store
from storage.files.files import get_file
from storage.models import Batch, BatchRequest
from storage.queue import leases, results
from storage.queue.reaping import release_expired_leases
from storage.settings import get_settings
from tests.conftest import Backend
from tests.factories import expire_leases
from tests.integration.worker.feed.test_runner import enqueue, statuses
from worker.engine import EngineResult
from worker.engine.fake import FakeEngine
from worker.feed import queue_io, writes
from worker.feed.runner import Runner
from worker.jobs.finalize import finalize_batch

pytestmark = pytest.mark.backfill_env({"BACKFILL_MODELS": json.dumps({"fake-model": {"path": "fake:"}})})


def make_runner(worker_id: str = "w1", max_num_seqs: int = 4) -> Runner:
    engine = FakeEngine("fake-model", max_num_seqs=max_num_seqs, max_model_len=10**9)
    return Runner(engine, model="fake-model", settings=get_settings(), worker_id=worker_id)


def run_until_idle(runner: Runner) -> None:
    while runner.run_for(5.0):
        pass


def output_custom_ids(batch_id: str) -> list[str]:
    """Finalize the batch and read its output file back: the custom_id of every line, in file order."""
    assert finalize_batch(get_blob_store(), batch_id=batch_id) == "completed"
    with transaction() as session:
        batch = session.get(Batch, batch_id)
        assert batch is not None and batch.output_file_id
        key = get_file(session, tenant_id=batch.tenant_id, file_id=batch.output_file_id).blob_key
    text = b"".join(get_blob_store().open_stream(key))
    return [json.loads(line)["custom_id"] for line in text.splitlines() if line]


def requeue_expired() -> int:
    """The reaper after every lease ran out: held rows go back to the queue."""
    with transaction() as session:
        expire_leases(session)
    with transaction() as session:
        return release_expired_leases(session, max_attempts=3)


def test_with_the_io_threads_every_request_ends_in_exactly_one_line(backend: Backend) -> None:
    batch_id = enqueue(40, max_tokens=6)
    runner = make_runner()
    run_until_idle(runner)
    runner.close_io()
    assert statuses(batch_id) == {"completed": 40}
    assert sorted(output_custom_ids(batch_id)) == sorted(f"r{i}" for i in range(40))
    with transaction() as session:
        batch = session.get(Batch, batch_id)
        attempts = set(session.scalars(select(BatchRequest.attempts).where(BatchRequest.batch_id == batch_id)))
    assert batch is not None and batch.request_completed == 40 and attempts == {1}


def test_a_writer_failure_mid_run_surfaces_and_its_requests_run_again_once(
    backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    batch_id = enqueue(30, max_tokens=3)
    calls: list[int] = []

    def second_commit_fails(session: Any, **kwargs: Any) -> results.Recorded:
        calls.append(len(kwargs["outcomes"]))
        if len(calls) == 2:
            raise RuntimeError("the database went away mid-commit")
        return results.record_outcomes(session, **kwargs)

    monkeypatch.setattr(writes, "record_outcomes", second_commit_fails)
    runner = make_runner()
    with pytest.raises(RuntimeError, match="went away"):  # raised on the engine's thread, as inline
        run_until_idle(runner)
    run_until_idle(runner)  # the runner serves on; the failed group's rows stay leased, not renewed
    lost = calls[1]
    assert statuses(batch_id) == {"completed": 30 - lost, "running": lost}
    assert requeue_expired() == lost
    run_until_idle(runner)
    runner.close_io()
    assert sorted(output_custom_ids(batch_id)) == sorted(f"r{i}" for i in range(30))
    with transaction() as session:
        batch = session.get(Batch, batch_id)
        attempts = list(session.scalars(select(BatchRequest.attempts).where(BatchRequest.batch_id == batch_id)))
    assert batch is not None and batch.request_completed == 30
    assert sorted(attempts) == [1] * (30 - lost) + [2] * lost


def test_a_worker_that_dies_before_its_writer_commits_loses_nothing_and_its_late_commit_counts_nothing(
    backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    batch_id = enqueue(12, max_tokens=2)
    gate = threading.Event()

    def stalled_for_w1(session: Any, **kwargs: Any) -> results.Recorded:
        if kwargs["worker_id"] == "w1":
            gate.wait(30)  # w1's writer hangs before its first commit (say its connection froze)
        return results.record_outcomes(session, **kwargs)

    monkeypatch.setattr(writes, "record_outcomes", stalled_for_w1)
    dying = make_runner("w1")
    serving = threading.Thread(target=dying.run_for, args=(3.0,), daemon=True)
    serving.start()
    for _ in range(100):  # every request decoded and handed to w1's writer
        if not dying.engine.has_unfinished() and not dying.inflight and statuses(batch_id) == {"running": 12}:
            break
        time.sleep(0.05)
    assert statuses(batch_id) == {"running": 12}  # nothing committed: w1 now "crashes"
    assert requeue_expired() == 12
    survivor = make_runner("w2")
    run_until_idle(survivor)
    survivor.close_io()
    gate.set()  # w1's stalled commit finally runs: the lease check refuses every result
    serving.join(timeout=10)
    dying.close_io()
    assert sorted(output_custom_ids(batch_id)) == sorted(f"r{i}" for i in range(12))
    with transaction() as session:
        batch = session.get(Batch, batch_id)
        owners = set(session.scalars(select(BatchRequest.lease_owner).where(BatchRequest.batch_id == batch_id)))
    assert batch is not None and batch.request_completed == 12 and batch.request_failed == 0
    assert owners <= {"w2", None}


def test_a_hand_back_returns_in_flight_rows_and_rows_claimed_but_not_yet_started(backend: Backend) -> None:
    batch_id = enqueue(20, max_tokens=10**8)  # never finishes on its own
    runner = make_runner(max_num_seqs=4)
    runner.run_for(0.5)
    assert statuses(batch_id) == {"running": 8, "queued": 12}
    runner.io.request_claim(4)  # a claim the engine has not collected when the switch comes
    assert runner.hand_back(drain_seconds=0) == 12
    runner.close_io()
    assert statuses(batch_id) == {"queued": 20}
    with pytest.raises(RuntimeError, match="closed"):
        runner.io.request_claim(1)


def test_a_hand_back_releases_its_rows_on_the_writer_thread_after_the_writes_before_it(
    backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    batch_id = enqueue(6, max_tokens=10**8)  # never finishes on its own
    runner = make_runner(max_num_seqs=2)
    runner.run_for(0.3)
    writes_seen: list[tuple[str, str]] = []  # (what, on which thread), in the order the database saw them
    real_renew_leases, real_release = writes.renew_leases, writes.release

    def renew_leases(*args: Any, **kwargs: Any) -> Any:
        writes_seen.append(("renew", threading.current_thread().name))
        return real_renew_leases(*args, **kwargs)

    def release(session: Any, **kwargs: Any) -> int:
        writes_seen.append(("release", threading.current_thread().name))
        return real_release(session, **kwargs)

    monkeypatch.setattr(writes, "renew_leases", renew_leases)
    monkeypatch.setattr(writes, "release", release)
    runner.io.renew(runner.held())  # a write handed over just before the hand-back
    assert runner.hand_back(drain_seconds=0) == 4
    runner.close_io()
    assert writes_seen == [("renew", "queue-writer-fake-model"), ("release", "queue-writer-fake-model")]
    assert statuses(batch_id) == {"queued": 6}


class HookedEngine(FakeEngine):
    """A fake engine that runs `on_top_up` when the runner tops up (it asks `dispatch_limit` first) and `on_step`
    before each step, both on the runner's thread."""

    def __init__(
        self, on_top_up: Callable[[], None], *, on_step: Callable[[], None] = lambda: None, **kwargs: Any
    ) -> None:
        super().__init__("fake-model", max_model_len=10**9, **kwargs)
        self.on_top_up, self.on_step = on_top_up, on_step

    def dispatch_limit(self) -> int | None:
        self.on_top_up()
        return super().dispatch_limit()

    def step(self) -> list[EngineResult]:
        self.on_step()
        return super().step()


def leased_to(worker_id: str, batch_id: str) -> set[str]:
    with transaction() as session:
        query = select(BatchRequest.id).where(
            BatchRequest.batch_id == batch_id, BatchRequest.status == "running", BatchRequest.lease_owner == worker_id
        )
        return set(session.scalars(query))


def test_a_run_task_stopped_while_its_claim_lands_leaves_no_row_leased_outside_the_engine(
    backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    batch_id = enqueue(6, max_tokens=10**8)  # never finishes on its own
    stop, landing = threading.Event(), threading.Event()
    real_claim = queue_io.claim

    def late_claim(session: Any, **kwargs: Any) -> list[Any]:
        assert landing.wait(10)
        return real_claim(session, **kwargs)

    def claim_as_sigterm_comes() -> None:
        if stop.is_set() or not runner.inflight:
            return
        monkeypatch.setattr(queue_io, "claim", late_claim)
        runner.io.request_claim(2, held=frozenset(runner.held()))  # a claim is on its way ...
        stop.set()  # ... when SIGTERM comes: this is the task's last top-up

    engine = HookedEngine(claim_as_sigterm_comes, on_step=landing.set, max_num_seqs=2)  # lands after the top-up
    runner = Runner(engine, model="fake-model", settings=get_settings(), worker_id="w1")

    assert runner.run_for(30.0, stop=stop)

    # Its rows are leased to this worker: they must be in the engine, where renewals and the hand-back see them,
    # not waiting unrenewed for a next task that may never come.
    leased = leased_to("w1", batch_id)
    assert len(leased) == 6 and set(runner.held()) == leased
    assert runner.hand_back(drain_seconds=0) == 6  # the stop's hand-back returns every one of them
    runner.close_io()
    assert statuses(batch_id) == {"queued": 6}


@pytest.mark.parametrize("backend", ["postgres"], indirect=True)  # two transactions at once: SQLite serialises
def test_a_row_requeued_under_the_runner_and_claimed_back_during_a_renewal_runs_on_and_ends_once(
    backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    batch_id = enqueue(1, max_tokens=50)
    renewed_lost, claimed = threading.Event(), threading.Event()

    def renew(session: Any, **kwargs: Any) -> set[str]:
        lost = leases.renew(session, **kwargs)
        if lost:
            renewed_lost.set()
        return lost

    def claim(session: Any, **kwargs: Any) -> list[Any]:
        assert renewed_lost.wait(10)  # the writer's renewal found the row gone ...
        rows = queue_io_claim(session, **kwargs)  # ... and the claimer leases it back before it is taken back
        claimed.set()
        return rows

    def take_back(session: Any, **kwargs: Any) -> set[str]:
        assert claimed.wait(10)
        return leases.take_back(session, **kwargs)

    queue_io_claim = queue_io.claim
    triggered: list[bool] = []

    def reaper_between_steps() -> None:
        if triggered or not runner.inflight:
            return
        triggered.append(True)
        runner.io.drain()
        runner.io.take_claimed()  # the runner's own last claim (it found nothing more): out of the way
        monkeypatch.setattr(writes, "renew", renew)
        monkeypatch.setattr(queue_io, "claim", claim)
        monkeypatch.setattr(writes, "take_back", take_back)
        assert requeue_expired() == 1  # the reaper re-queues the row under the runner (its lease ran out)
        runner.io.renew(runner.held())
        runner.io.request_claim(4, held=frozenset(runner.held()))
        runner.io.drain()  # both landed before this top-up collects them

    engine = HookedEngine(reaper_between_steps, max_num_seqs=4)
    runner = Runner(engine, model="fake-model", settings=get_settings(), worker_id="w1")
    run_until_idle(runner)
    runner.close_io()

    assert triggered and claimed.is_set()
    assert statuses(batch_id) == {"completed": 1}  # not left leased to w1 with nothing running it
    assert len(output_custom_ids(batch_id)) == 1
