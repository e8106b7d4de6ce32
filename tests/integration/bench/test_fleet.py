"""The fleet simulation (bench/fleet.py) in miniature: a handful of virtual GPU nodes on one Postgres queue, through
the real claim, record and renew code, run every request exactly once (the full ramp runs in `make bench`)."""

from __future__ import annotations

import json
import time

import pytest
from sqlalchemy import func, select

from bench.fleet_nodes import Fleet, Workload
from storage.db import transaction
from storage.models import BatchRequest
from tests.conftest import Backend
from tests.integration.jobs import chat, submit_job

pytestmark = pytest.mark.backfill_env({"BACKFILL_MODELS": json.dumps({"fake-model": {"path": "fake:"}})})


def test_six_virtual_nodes_on_one_queue_claim_no_row_twice_and_store_each_result_once(backend: Backend) -> None:
    if backend.name != "postgres":
        pytest.skip("concurrent claimers: SKIP LOCKED is a Postgres matter")
    for tenant in ("a", "b"):
        submit_job([chat(i) for i in range(300)], tenant=tenant)
    quick = Workload("test", prompt_tokens=7, out_low=1, out_high=20, log_uniform=False, step_seconds=0.002)
    fleet = Fleet(quick, pool=4, process=0, max_num_seqs=16, model="fake-model")
    for index in range(6):
        fleet.add_node(index)
    deadline = time.monotonic() + 60
    while len(set(fleet.stored_ids)) < 600 and time.monotonic() < deadline:
        fleet.tick()
        time.sleep(0.005)
    fleet.claimer.shutdown(wait=True)
    fleet.executor.shutdown(wait=True)
    assert not fleet.errors
    assert len(fleet.claimed_ids) == len(set(fleet.claimed_ids)) == 600  # no row handed to two nodes
    assert len(fleet.stored_ids) == len(set(fleet.stored_ids)) == 600
    assert len({c for c in fleet.claims if c[3]}) > 6  # the nodes refilled: more claims than nodes
    with transaction() as session:
        rows = dict(session.execute(select(BatchRequest.status, func.count()).group_by(BatchRequest.status)).all())
        retried = session.scalar(select(func.count()).where(BatchRequest.attempts != 1))
    assert rows == {"completed": 600} and retried == 0
