"""Issue 14 items 10 and 11: a live worker keeps its leases between tasks; a gone one loses them at once.

A worker's heartbeat thread (worker/process/liveness.py) renews the leases of work its runner holds while no task
runs; a worker that restarts on its host takes its predecessor's leases back at start, and the reaper
releases the leases of a worker whose heartbeat went stale, instead of each waiting out its lease.
"""

from __future__ import annotations

import json
import os
import subprocess
import time

import pytest
from sqlalchemy import select

from storage.db import transaction
from storage.models import BatchRequest
from storage.queue.claim import claim
from storage.queue.workers import WorkerIdentity
from storage.settings import get_settings
from tests.conftest import Backend
from tests.integration.jobs import chat, submit_job
from worker.engine.fake import FakeEngine
from worker.feed.runner import Runner
from worker.jobs.reaper import reap
from worker.process.liveness import Heartbeat, register

LEASE_SECONDS = 5
STALE_SECONDS = 3

pytestmark = pytest.mark.backfill_env(
    {
        "BACKFILL_MODELS": json.dumps({"fake-model": {"path": "fake:"}}),
        "BACKFILL_LEASE_SECONDS": str(LEASE_SECONDS),
        "BACKFILL_HEARTBEAT_SECONDS": "1",
        "BACKFILL_WORKER_STALE_SECONDS": str(STALE_SECONDS),
    }
)


def statuses(batch_id: str) -> dict[str, tuple[str, str | None, int]]:
    with transaction() as session:
        rows = session.scalars(select(BatchRequest).where(BatchRequest.batch_id == batch_id))
        return {row.custom_id: (row.status, row.lease_owner, row.attempts) for row in rows}


def dead_pid() -> int:
    """The pid of a process that has already exited."""
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


def claim_all(worker_id: str) -> int:
    with transaction() as session:
        claimed = claim(
            session,
            settings=get_settings(),
            model="fake-model",
            worker_id=worker_id,
            limit=100,
            lease_seconds=LEASE_SECONDS,
        )
    return len(claimed)


def test_a_worker_idle_between_tasks_longer_than_the_lease_keeps_its_work_and_finishes_it_once(
    backend: Backend,
) -> None:
    batch_id, _ = submit_job([chat(i, max_tokens=2 if i < 4 else 300) for i in range(8)])
    engine = FakeEngine("fake-model", max_num_seqs=4, max_model_len=10**6, step_seconds=0.01)
    identity = WorkerIdentity("gpu-a", "host-a", 1)
    runner = Runner(engine, model="fake-model", settings=get_settings(), worker_id=identity.worker_id)
    heartbeat = Heartbeat(identity, get_settings(), models=["fake-model"], runners=lambda: [runner])
    heartbeat.start()
    try:
        deadline = time.monotonic() + 60
        # Short tasks until the four short requests are done (a state, not a duration): the long four are held.
        while sum(status == "completed" for status, _, _ in statuses(batch_id).values()) < 4:
            assert time.monotonic() < deadline, "the four short requests never finished"
            runner.run_for(0.05)
        held = len(runner.inflight)
        time.sleep(LEASE_SECONDS + 1)  # no task runs: only the heartbeat keeps the leases
        with transaction() as session:
            assert reap(session).requeued == 0, "the reaper took back work a live worker holds"
        while runner.run_for(5.0):
            pass
    finally:
        heartbeat.shutdown()
    assert held == 4
    assert set(statuses(batch_id).values()) == {("completed", None, 1)}


def test_a_worker_restarted_on_its_host_gets_its_predecessors_leases_back_at_start(backend: Backend) -> None:
    batch_id, _ = submit_job([chat(i) for i in range(6)])
    before = WorkerIdentity("host-a:old", "host-a", dead_pid())  # killed -9: its process is gone
    register(before, models=["fake-model"])
    assert claim_all(before.worker_id) == 6
    released = register(WorkerIdentity("host-a:new", "host-a", dead_pid() + 100_000), models=["fake-model"])
    assert released == 6
    # Back in the queue now, not after the 5 s lease; the interrupted try still counts.
    assert set(statuses(batch_id).values()) == {("queued", None, 1)}


def test_a_worker_restarted_under_the_same_slot_takes_over_even_if_its_old_pid_is_reused(backend: Backend) -> None:
    submit_job([chat(i) for i in range(3)])
    before = WorkerIdentity("host-a:old", "host-a", os.getppid(), slot="gpu0")  # its pid now names another process
    register(before, models=["fake-model"])
    claim_all(before.worker_id)
    neighbour = WorkerIdentity("host-a:other", "host-a", 1, slot="gpu1")  # pid 1 is always alive
    assert register(neighbour, models=["fake-model"]) == 0, "a live neighbour in another slot lost its leases"
    assert register(WorkerIdentity("host-a:new", "host-a", os.getpid(), slot="gpu0"), models=["fake-model"]) == 3


def test_the_reaper_releases_the_leases_of_a_worker_whose_heartbeat_went_stale_at_once(backend: Backend) -> None:
    batch_id, _ = submit_job([chat(i) for i in range(4)])
    register(WorkerIdentity("host-b:1", "host-b", 1), models=["fake-model"])
    claim_all("host-b:1")
    with transaction() as session:
        assert reap(session).requeued == 0  # fresh heartbeat, leases valid
    time.sleep(STALE_SECONDS + 0.5)  # the worker stops beating (killed); its leases still run 1.5 s longer
    with transaction() as session:
        assert reap(session).requeued == 4
    assert set(statuses(batch_id).values()) == {("queued", None, 1)}


def test_a_lease_that_lapsed_under_a_live_worker_goes_back_without_using_an_attempt(backend: Backend) -> None:
    batch_id, _ = submit_job([chat(i) for i in range(2)])
    identity = WorkerIdentity("host-c:1", "host-c", 1)
    register(identity, models=["fake-model"])
    claim_all(identity.worker_id)
    heartbeat = Heartbeat(identity, get_settings(), models=["fake-model"], runners=lambda: [])
    heartbeat.start()  # beats, but holds no runner that renews these leases (say, its database calls failed)
    try:
        time.sleep(LEASE_SECONDS + 0.5)
        # Live at the reap whatever the machine did to the thread's timing (a CI run once saw it >3 s late):
        # the beat the thread would have sent, sent now; it renews nothing either.
        heartbeat.beat_once()
        with transaction() as session:
            assert reap(session).requeued == 2
    finally:
        heartbeat.shutdown()
    assert set(statuses(batch_id).values()) == {("queued", None, 0)}


def test_a_claim_that_returns_rows_the_worker_already_runs_is_a_re_lease_not_a_new_try(backend: Backend) -> None:
    batch_id, _ = submit_job([chat(i) for i in range(3)])
    with transaction() as session:
        first = claim(
            session,
            settings=get_settings(),
            model="fake-model",
            worker_id="gpu-a",
            limit=2,
            lease_seconds=LEASE_SECONDS,
        )
    with transaction() as session:  # the reaper re-queued them while gpu-a still runs them
        session.execute(
            BatchRequest.__table__.update()
            .where(BatchRequest.id.in_([item.id for item in first]))
            .values(status="queued", lease_owner=None, lease_id=None)
        )
    with transaction() as session:
        again = claim(
            session,
            settings=get_settings(),
            model="fake-model",
            worker_id="gpu-a",
            limit=3,
            lease_seconds=LEASE_SECONDS,
            held={item.id for item in first},
        )
    assert {item.id for item in first} < {item.id for item in again}
    assert sorted(attempts for _, _, attempts in statuses(batch_id).values()) == [1, 1, 1]
