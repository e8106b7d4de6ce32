"""Issue 14 item 10: work a runner holds between Celery tasks must keep its leases.

The runner keeps in-flight requests in its engine between `run_for` calls (one call = one `batch.run`
task). When the gap between two tasks outlasts the lease (a task failed on a database error, the next
`batch.run` went to another GPU worker), the reaper re-queues those rows; the next `run_for` then claims
before it renews and gets its own rows back, which the engine refuses as already in flight.
"""

from __future__ import annotations

import json
import time

import pytest
from sqlalchemy import select

from storage.db import transaction
from storage.models import BatchRequest
from storage.settings import get_settings
from tests.conftest import Backend
from tests.integration.jobs import chat, submit_job
from worker.engine.fake import FakeEngine
from worker.feed.runner import Runner
from worker.jobs.reaper import reap

LEASE_SECONDS = 5  # the smallest lease the settings allow

pytestmark = pytest.mark.backfill_env(
    {
        "BACKFILL_MODELS": json.dumps({"fake-model": {"path": "fake:"}}),
        "BACKFILL_LEASE_SECONDS": str(LEASE_SECONDS),
    }
)


# The Celery deployment's case (the embedded loop calls run_for back to back, so its gaps stay short).
ON_POSTGRES = pytest.mark.parametrize("backend", ["postgres"], indirect=True)


def rows(batch_id: str) -> list[BatchRequest]:
    with transaction() as session:
        return list(session.scalars(select(BatchRequest).where(BatchRequest.batch_id == batch_id)))


@ON_POSTGRES
def test_work_held_between_run_tasks_longer_than_the_lease_ends_in_one_success_line_each(
    backend: Backend,
) -> None:
    # Four short requests finish within the first task; four long ones are still in the engine at its end,
    # leaving the runner below its refill mark, so its next task claims before it renews.
    batch_id, status = submit_job([chat(i, max_tokens=2 if i < 4 else 100) for i in range(8)])
    if status != "in_progress":
        pytest.fail(f"the batch did not ingest: {status}")
    engine = FakeEngine("fake-model", max_num_seqs=4, max_model_len=10**6, step_seconds=0.01)
    runner = Runner(engine, model="fake-model", settings=get_settings(), worker_id="gpu-a")
    runner.run_for(0.3)  # one `batch.run` task: all 8 claimed, the 4 long ones still in the engine at its end
    held = len(runner.inflight)
    if held != 4:
        pytest.fail(f"{held} requests were held between the tasks, not the 4 long ones")
    time.sleep(LEASE_SECONDS + 0.5)  # the next task comes later than the lease lasts
    with transaction() as session:
        requeued = reap(session).requeued  # the reaper takes the worker's paused work back
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
def test_a_live_worker_whose_tasks_come_late_three_times_still_completes_its_held_requests(
    backend: Backend,
) -> None:
    # Eight long requests fill the runner (2 x max_num_seqs): it never claims on top, only renews.
    # Long enough that none finishes within the three 0.3 s tasks (a 1 ms step emits one token each).
    batch_id, status = submit_job([chat(i, max_tokens=1500) for i in range(8)])
    if status != "in_progress":
        pytest.fail(f"the batch did not ingest: {status}")
    engine = FakeEngine("fake-model", max_num_seqs=4, max_model_len=10**6, step_seconds=0.001)
    runner = Runner(engine, model="fake-model", settings=get_settings(), worker_id="gpu-a")
    for _ in range(3):
        runner.run_for(0.3)
        if len(runner.inflight) != 8:
            pytest.fail(f"{len(runner.inflight)} requests held between the tasks, not 8")
        time.sleep(LEASE_SECONDS + 0.5)
        with transaction() as session:
            reap(session)
    while runner.run_for(5.0):
        pass
    runner.close_io()
    result = rows(batch_id)
    outcomes = {(row.status, row.error_code) for row in result}
    assert outcomes == {("completed", None)}, f"attempts {[row.attempts for row in result]}, outcomes {outcomes}"
