"""Issue 14 item 10: work a runner holds between Celery tasks must keep its leases.

The runner keeps in-flight requests in its engine between `run_for` calls (one call = one `batch.run`
task). When the gap between two tasks outlasts the lease (a task failed on a database error, the next
`batch.run` went to another GPU worker), the reaper re-queues those rows; the next `run_for` then claims
before its renewal lands and gets its own rows back, which the engine refuses as already in flight.

The gap is made by running the leases out in the database (the reaper's view of a late task), not by
sleeping through them, and each phase waits for a state the test can read, not for a duration.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable

import pytest
from sqlalchemy import select, update

from storage.db import transaction
from storage.models import BatchRequest
from storage.settings import get_settings
from tests.conftest import Backend
from tests.integration.jobs import chat, submit_job
from worker.engine.fake import FakeEngine
from worker.feed.runner import Runner
from worker.jobs.reaper import reap

pytestmark = pytest.mark.backfill_env({"BACKFILL_MODELS": json.dumps({"fake-model": {"path": "fake:"}})})


# The Celery deployment's case (the embedded loop calls run_for back to back, so its gaps stay short).
ON_POSTGRES = pytest.mark.parametrize("backend", ["postgres"], indirect=True)


def rows(batch_id: str) -> list[BatchRequest]:
    with transaction() as session:
        return list(session.scalars(select(BatchRequest).where(BatchRequest.batch_id == batch_id)))


def run_tasks_until(runner: Runner, done: Callable[[], bool], *, task_seconds: float = 0.05) -> None:
    """At least one short `batch.run` task, more until `done()` holds (each ends with its writes committed)."""
    deadline = time.monotonic() + 60
    runner.run_for(task_seconds)
    while not done():
        if time.monotonic() > deadline:
            pytest.fail("the runner never reached the state the test waits for")
        runner.run_for(task_seconds)


def lease_gap_then_reap() -> int:
    """The next task comes later than the lease lasts: every lease runs out and the reaper re-queues the rows."""
    with transaction() as session:
        session.execute(update(BatchRequest).where(BatchRequest.status == "running").values(lease_expires_at=0.0))
    with transaction() as session:
        return reap(session).requeued


@ON_POSTGRES
def test_work_held_between_run_tasks_longer_than_the_lease_ends_in_one_success_line_each(backend: Backend) -> None:
    # Four short requests finish within the first tasks; four long ones are still in the engine after them,
    # leaving the runner below its refill mark, so its next task claims before its renewal lands.
    batch_id, status = submit_job([chat(i, max_tokens=2 if i < 4 else 300) for i in range(8)])
    if status != "in_progress":
        pytest.fail(f"the batch did not ingest: {status}")
    engine = FakeEngine("fake-model", max_num_seqs=4, max_model_len=10**6, step_seconds=0.01)
    runner = Runner(engine, model="fake-model", settings=get_settings(), worker_id="gpu-a")
    run_tasks_until(runner, lambda: sum(row.status == "completed" for row in rows(batch_id)) == 4)
    held = len(runner.inflight)
    if held != 4:
        pytest.fail(f"{held} requests were held between the tasks, not the 4 long ones")
    requeued = lease_gap_then_reap()
    if requeued != held:
        pytest.fail(f"the reaper re-queued {requeued} of the {held} held requests")
    while runner.run_for(5.0):  # the next tasks, on the same live worker
        pass
    runner.close_io()  # the I/O threads must not outlive this test's database
    result = rows(batch_id)
    errors = {row.custom_id: row.error_code for row in result if row.status != "completed"}
    assert errors == {}, f"{len(errors)} of {held} held requests ended as error lines: {errors}"
    # A handover is not an interruption: it must not use up the request's attempts (the reaper gives up at 3).
    assert max(row.attempts for row in result) == 1


@ON_POSTGRES
def test_a_live_worker_whose_tasks_come_late_three_times_still_completes_its_held_requests(backend: Backend) -> None:
    # Eight long requests fill the runner (2 x max_num_seqs): it never claims on top, only renews.
    # Long enough that none finishes within the three short tasks (a 1 ms step emits one token each).
    batch_id, status = submit_job([chat(i, max_tokens=1500) for i in range(8)])
    if status != "in_progress":
        pytest.fail(f"the batch did not ingest: {status}")
    engine = FakeEngine("fake-model", max_num_seqs=4, max_model_len=10**6, step_seconds=0.001)
    runner = Runner(engine, model="fake-model", settings=get_settings(), worker_id="gpu-a")

    def all_eight_held() -> bool:
        leased = [row for row in rows(batch_id) if row.status == "running" and row.lease_owner == "gpu-a"]
        return len(runner.inflight) == 8 and len(leased) == 8

    for _ in range(3):
        run_tasks_until(runner, all_eight_held)
        if lease_gap_then_reap() != 8:
            pytest.fail("the reaper did not find the 8 held requests' leases run out")
    while runner.run_for(5.0):
        pass
    runner.close_io()
    result = rows(batch_id)
    outcomes = {(row.status, row.error_code) for row in result}
    assert outcomes == {("completed", None)}, f"attempts {[row.attempts for row in result]}, outcomes {outcomes}"
    assert max(row.attempts for row in result) == 1
