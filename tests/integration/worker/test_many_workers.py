"""Issue 15 section 2: several GPU workers on one queue, each with its own worker id.

Every live worker keeps claiming while its model has queued work (none waits for another to hand over),
no row is claimed by two live workers, each custom_id ends in exactly one result, a worker of another
model never takes this model's work, a worker that starts late joins in, and the work of a worker that
stops without a word (killed) is finished by the others once its heartbeat goes stale.
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

import pytest
from sqlalchemy import select

from storage.db import transaction
from storage.models import BatchRequest
from storage.queue.workers import WorkerIdentity
from storage.settings import get_settings
from tests.conftest import Backend
from tests.integration.jobs import chat, submit_job
from worker.engine import EngineRequest, EngineResult
from worker.engine.fake import FakeEngine
from worker.feed.runner import Runner
from worker.jobs.reaper import reap
from worker.process.liveness import Heartbeat, SelfWake

STALE_SECONDS = 3
MODELS = {"model-a": {"path": "fake:"}, "model-b": {"path": "fake:"}}

pytestmark = [
    pytest.mark.parametrize("backend", ["postgres"], indirect=True),
    pytest.mark.backfill_env(
        {
            "BACKFILL_MODELS": json.dumps(MODELS),
            "BACKFILL_LEASE_SECONDS": "60",  # longer than the test: only the stale heartbeat can free a lease
            "BACKFILL_HEARTBEAT_SECONDS": "1",
            "BACKFILL_WORKER_STALE_SECONDS": str(STALE_SECONDS),
        }
    ),
]


class CountingEngine(FakeEngine):
    """The fake engine, remembering every request it was handed (to find double claims)."""

    def __init__(self, model: str) -> None:
        super().__init__(model, max_num_seqs=4, max_model_len=10**6, step_seconds=0.01)
        self.added: list[str] = []

    def add(self, request: EngineRequest) -> EngineResult | None:
        self.added.append(request.request_id)
        return super().add(request)


@dataclass
class Worker:
    """One GPU worker: a runner fed in a loop (its `batch.run` tasks) and its heartbeat thread."""

    name: str
    model: str = "model-a"
    killed: threading.Event = field(default_factory=threading.Event)
    stopped: threading.Event = field(default_factory=threading.Event)
    first_claim_at: float | None = None

    def __post_init__(self) -> None:
        self.engine = CountingEngine(self.model)
        self.runner = Runner(self.engine, model=self.model, settings=get_settings(), worker_id=self.name)
        identity = WorkerIdentity(self.name, f"host-{self.name}", 1)
        self.heartbeat = Heartbeat(identity, get_settings(), models=[self.model], runners=lambda: [self.runner])
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def start(self) -> Worker:
        self.heartbeat.start()
        self.thread.start()
        return self

    def _loop(self) -> None:
        while not (self.killed.is_set() or self.stopped.is_set()):
            if not self.runner.run_for(0.2, stop=self.killed) and not self.killed.is_set():
                time.sleep(0.05)
            if self.engine.added and self.first_claim_at is None:
                self.first_claim_at = time.monotonic()

    def kill(self) -> None:
        """Stop dead: no hand-back, no goodbye; leases and the heartbeat row stay behind."""
        self.killed.set()
        self.thread.join(10)
        self.heartbeat.stop.set()
        self.heartbeat.thread.join(10)

    def stop(self) -> None:
        self.stopped.set()
        self.thread.join(10)
        self.heartbeat.shutdown()


def outcomes(batch_ids: list[str]) -> list[tuple[str, str, str, str | None]]:
    with transaction() as session:
        rows = session.execute(
            select(BatchRequest.batch_id, BatchRequest.custom_id, BatchRequest.status, BatchRequest.run_id).where(
                BatchRequest.batch_id.in_(batch_ids)
            )
        )
        return [(b, c, s, r) for b, c, s, r in rows]


def wait(predicate: object, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return True
        time.sleep(0.1)
    return False


def test_every_live_worker_keeps_claiming_and_a_killed_ones_work_is_finished_by_the_others(backend: Backend) -> None:
    jobs = [
        submit_job([chat(i, max_tokens=40, model="model-a") for i in range(60)], tenant=f"t{n}")[0] for n in range(2)
    ]
    other = submit_job([chat(i, max_tokens=5, model="model-b") for i in range(10)], tenant="t9")[0]
    a1, a2, victim = Worker("a1").start(), Worker("a2").start(), Worker("a3").start()
    b1 = Worker("b1", model="model-b").start()
    late: Worker | None = None
    try:
        live = (a1, a2, victim)
        assert wait(lambda: all(len(w.engine.added) >= 8 for w in live), 20), [len(w.engine.added) for w in live]
        held = set(victim.runner.held())
        victim.kill()  # mid-run, holding work
        assert held, "the killed worker held nothing"
        late = Worker("a4").start()  # starts late: joins in without anyone restarting
        killed_at = time.monotonic()
        while not wait(lambda: {s for *_, s, _ in outcomes(jobs)} == {"completed"}, 1):
            with transaction() as session:
                reap(session)
            assert time.monotonic() - killed_at < 60, "the others never finished the killed worker's work"
        assert wait(lambda: {s for *_, s, _ in outcomes([other])} == {"completed"}, 20)
    finally:
        if not victim.killed.is_set():
            victim.kill()
        for worker in (a1, a2, b1, late):
            if worker is not None:
                worker.stop()
    rows = outcomes(jobs)
    assert len(rows) == 120 and Counter((b, c) for b, c, *_ in rows).most_common(1)[0][1] == 1
    assert late is not None and late.engine.added, "the worker that started late never claimed"
    # Zero double claims: only what the killed worker held went to a second engine.
    claims = Counter(rid for w in (a1, a2, victim, late) for rid in set(w.engine.added))
    assert {rid for rid, n in claims.items() if n > 1} <= held
    assert not set(b1.engine.added) & {rid for w in (a1, a2, victim, late) for rid in w.engine.added}
    assert all(len(w.engine.added) > 0 for w in (a1, a2, victim, late))


def test_an_idle_worker_wakes_itself_once_while_its_model_has_queued_work(backend: Backend) -> None:
    sent: list[float] = []
    wake = SelfWake(lambda: sent.append(time.monotonic()))
    identity = WorkerIdentity("a1", "host-a1", 1)
    heartbeat = Heartbeat(identity, get_settings(), models=["model-a"], runners=lambda: [], self_wake=wake)
    heartbeat.beat_once()
    assert sent == [], "woke with an empty queue"
    submit_job([chat(i, model="model-a") for i in range(3)])
    heartbeat.beat_once()
    heartbeat.beat_once()
    assert len(sent) == 1, "one wake-up on its way is enough"
    wake.task_started()
    heartbeat.beat_once()
    assert len(sent) == 1, "woke itself while a task ran"
    wake.task_ended(more=True)  # a task that ends with work left goes on at once on the same worker
    assert len(sent) == 2
