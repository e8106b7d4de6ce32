"""Generation checkpoints on the queue row: stored with a hand-back, handed to the next claim, never shrunk."""

from __future__ import annotations

import json

import pytest
from sqlalchemy import select

from storage.batches.control import pause_batch, resume_batch
from storage.db import transaction
from storage.models import Batch, BatchRequest
from storage.queue.checkpoints import save_checkpoints, save_handed_back, unpack_tokens
from storage.queue.claim import claim
from storage.queue.leases import Outcome, record, release
from storage.settings import get_settings
from tests.conftest import Backend
from tests.integration.jobs import chat, submit_job

pytestmark = pytest.mark.backfill_env({"BACKFILL_MODELS": json.dumps({"fake-model": {"path": "fake:"}})})


def _claim(worker: str, limit: int = 3) -> list[str]:
    with transaction() as session:
        rows = claim(
            session, settings=get_settings(), model="fake-model", worker_id=worker, limit=limit, lease_seconds=60
        )
    return [row.id for row in rows]


def _row(request_id: str) -> BatchRequest:
    with transaction() as session:
        row = session.get(BatchRequest, request_id)
        assert row is not None
        return row


def test_a_drained_request_comes_back_with_the_tokens_it_generated(backend: Backend) -> None:
    submit_job([chat(i) for i in range(2)])
    first, second = _claim("w1")
    generated = [5, 70_000, 0, 3] * 200
    with transaction() as session:
        released = release(session, worker_id="w1", request_ids=[first, second], checkpoints={first: generated})
    assert released == 2
    row = _row(first)
    assert row.status == "queued" and row.checkpoint_tokens == 800
    assert row.checkpoint is not None and len(row.checkpoint) < 800  # packed and compressed, not 4 bytes a token
    assert _row(second).checkpoint is None
    with transaction() as session:
        again = claim(session, settings=get_settings(), model="fake-model", worker_id="w2", limit=2, lease_seconds=60)
    by_id = {row.id: row for row in again}
    assert by_id[first].checkpoint is not None and unpack_tokens(by_id[first].checkpoint) == generated
    assert by_id[second].checkpoint is None


def test_a_checkpoint_is_never_replaced_by_a_shorter_one_and_only_the_lease_holder_writes(backend: Backend) -> None:
    submit_job([chat(0)])
    (rid,) = _claim("w1")
    with transaction() as session:
        assert save_checkpoints(session, worker_id="w1", checkpoints={rid: [1, 2, 3]}) == {rid}
        assert save_checkpoints(session, worker_id="w1", checkpoints={rid: [1, 2]}) == set()
        assert save_checkpoints(session, worker_id="other", checkpoints={rid: [1, 2, 3, 4]}) == set()
    row = _row(rid)
    assert row.checkpoint is not None and unpack_tokens(row.checkpoint) == [1, 2, 3]


def test_a_paused_request_keeps_the_tokens_its_worker_stores_after_losing_the_lease(backend: Backend) -> None:
    batch_id, _ = submit_job([chat(i) for i in range(2)])
    first, second = _claim("w1")
    with transaction() as session:
        tenant_id = session.get(Batch, batch_id).tenant_id  # type: ignore[union-attr]
        pause_batch(session, tenant_id=tenant_id, batch_id=batch_id)
    with transaction() as session:  # the worker's next renewal finds both leases gone and stores what it had
        stored = save_handed_back(session, checkpoints={first: [9] * 50, second: [8] * 20})
    assert stored == {first, second}
    with transaction() as session:
        resume_batch(session, tenant_id=tenant_id, batch_id=batch_id)
    with transaction() as session:
        again = claim(session, settings=get_settings(), model="fake-model", worker_id="w2", limit=2, lease_seconds=60)
    assert all(row.checkpoint is not None for row in again)
    assert {row.id: unpack_tokens(row.checkpoint or b"") for row in again} == {first: [9] * 50, second: [8] * 20}
    with transaction() as session:  # leased again: a late write from the first worker is refused
        assert save_handed_back(session, checkpoints={first: [7] * 80}) == set()


def test_a_finished_request_drops_its_checkpoint(backend: Backend) -> None:
    submit_job([chat(0)])
    (rid,) = _claim("w1")
    with transaction() as session:
        save_checkpoints(session, worker_id="w1", checkpoints={rid: list(range(40))})
        record(session, worker_id="w1", run_id="run_1", outcomes=[Outcome(rid, 200, {"ok": True}, 5, 40, 0.1)])
    with transaction() as session:
        row = session.execute(
            select(BatchRequest.status, BatchRequest.checkpoint, BatchRequest.checkpoint_tokens).where(
                BatchRequest.id == rid
            )
        ).one()
    assert tuple(row) == ("completed", None, 0)
