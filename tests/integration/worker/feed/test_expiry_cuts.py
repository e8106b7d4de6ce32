"""Partial answers at expiry on the runner, the fake engine and a real database: lines still generating when the
window closes end with what they generated so far; with `on_expiry: "continue_in_background"` they carry on
from their checkpoints in a background child of the retry tree, and the merged view gives each line once."""

from __future__ import annotations

import json
from typing import Any

import orjson
import pytest
from prometheus_client import REGISTRY
from sqlalchemy import select, update

from storage import lifecycle
from storage.batches.results import merged_results
from storage.clock import now
from storage.db import transaction
from storage.files.blobs import get_blob_store
from storage.finance.budgets import batch_spend
from storage.models import Batch, BatchRequest, File
from storage.queue.checkpoints import stored_tokens
from storage.queue.claim import claim
from storage.queue.expiry import CONTINUE_IN_BACKGROUND
from storage.queue.reaping import expire_overdue
from storage.settings import get_settings
from storage.windows import BACKGROUND_WINDOW
from tests.conftest import Backend
from tests.integration.worker.feed.test_runner import enqueue, make_runner, statuses
from worker.engine.fake import FakeEngine, _words
from worker.feed.runner import Runner
from worker.jobs.finalize import finalize_batch
from worker.jobs.reaper import reap

pytestmark = pytest.mark.backfill_env({"BACKFILL_MODELS": json.dumps({"fake-model": {"path": "fake:"}})})


def window_closes(batch_id: str, *, seconds_ago: int = 1) -> None:
    """The batch's window closed `seconds_ago` (its rows' deadlines with it), as a clock moved on would have it."""
    past = now() - seconds_ago
    with transaction() as session:
        session.execute(update(Batch).where(Batch.id == batch_id).values(expires_at=past))
        session.execute(update(BatchRequest).where(BatchRequest.batch_id == batch_id).values(deadline=past))


def cuts(outcome: str) -> float:
    """The worker's count of requests cut short at expiry, by outcome (backfill_expiry_cuts_total)."""
    return REGISTRY.get_sample_value("backfill_expiry_cuts_total", {"model": "fake-model", "outcome": outcome}) or 0.0


def reap_once() -> list[str]:
    with transaction() as session:
        return reap(session).expired_batches


def file_lines(batch_id: str, kind: str) -> list[dict[str, Any]]:
    with transaction() as session:
        batch = session.get(Batch, batch_id)
        assert batch is not None
        file_id = batch.output_file_id if kind == "output" else batch.error_file_id
        if file_id is None:
            return []
        key = session.get(File, file_id).blob_key  # type: ignore[union-attr]
    data = b"".join(get_blob_store().open_stream(key, chunk_bytes=1 << 16))
    return [json.loads(line) for line in data.splitlines()]


def test_lines_generating_at_expiry_end_with_their_text_so_far_and_the_rest_as_batch_expired(backend: Backend) -> None:
    batch_id = enqueue(10, max_tokens=10**8)  # never finish on their own
    runner = make_runner(max_num_seqs=4)  # 4 decoding, 4 waiting for a slot, 2 queued
    runner.run_for(0.3)
    assert statuses(batch_id) == {"running": 8, "queued": 2}
    window_closes(batch_id)
    reap_once()  # queued lines end at once; running ones are left to their worker for the grace
    assert statuses(batch_id) == {"running": 8, "expired": 2}
    before = {outcome: cuts(outcome) for outcome in ("answered", "unanswered")}
    runner.run_for(0.5)  # its renewal finds them overdue: cut, recorded; the 4 with no token yet go back
    assert statuses(batch_id) == {"completed": 4, "queued": 4, "expired": 2}
    assert {outcome: cuts(outcome) - count for outcome, count in before.items()} == {"answered": 4, "unanswered": 4}
    reap_once()
    assert statuses(batch_id) == {"completed": 4, "expired": 6}
    assert not runner.inflight and not runner.engine.has_unfinished()

    assert finalize_batch(get_blob_store(), batch_id=batch_id) == lifecycle.EXPIRED  # its window closed on it
    outputs, errors = file_lines(batch_id, "output"), file_lines(batch_id, "error")
    assert len(outputs) == 4 and len(errors) == 6
    assert sorted(line["custom_id"] for line in outputs + errors) == sorted(f"r{i}" for i in range(10))  # once each
    for line in outputs:
        body = line["response"]["body"]
        choice = body["choices"][0]
        assert line["response"]["status_code"] == 200 and line["error"] is None
        assert choice["finish_reason"] == "length" and body["backfill"] == {"cut_by": "expiry"}
        words = len(choice["message"]["content"].split())
        assert words >= 1 and body["usage"]["completion_tokens"] == words
    assert {line["error"]["code"] for line in errors} == {"batch_expired"}
    with transaction() as session:
        batch = session.get(Batch, batch_id)
        assert batch is not None and batch_spend(session, get_settings(), batch=batch) > 0  # what was generated


def test_a_worker_that_never_renews_leaves_its_lines_to_the_reaper_after_the_grace(backend: Backend) -> None:
    batch_id = enqueue(3, max_tokens=10**8)
    with transaction() as session:  # a worker claims them, then goes silent
        claim(session, settings=get_settings(), model="fake-model", worker_id="gone", limit=3, lease_seconds=600)
    window_closes(batch_id, seconds_ago=1)
    reap_once()
    assert statuses(batch_id) == {"running": 3}
    window_closes(batch_id, seconds_ago=get_settings().expiry_cut_grace_seconds + 1)
    reap_once()
    assert statuses(batch_id) == {"expired": 3}
    assert finalize_batch(get_blob_store(), batch_id=batch_id) == lifecycle.EXPIRED


def test_a_batch_that_continues_in_the_background_hands_its_unfinished_lines_to_a_child_from_their_checkpoints(
    backend: Backend,
) -> None:
    batch_id = enqueue(6, max_tokens=200)
    with transaction() as session:
        session.execute(update(Batch).where(Batch.id == batch_id).values(on_expiry=CONTINUE_IN_BACKGROUND))
    slow = FakeEngine("fake-model", max_num_seqs=4, step_seconds=0.01)  # a token a line every 10 ms
    runner = Runner(slow, model="fake-model", settings=get_settings(), worker_id="w1")
    runner.run_for(0.3)  # 4 decoding, 2 waiting for a slot
    runner.hand_back(drain_seconds=0)  # a drain: the running lines go back with the tokens they generated
    with transaction() as session:
        rows = session.execute(select(BatchRequest.id, BatchRequest.custom_id).where(BatchRequest.batch_id == batch_id))
        saved = {custom_id: stored_tokens(session, request_id=rid) for rid, custom_id in rows}
    assert sum(1 for tokens in saved.values() if tokens) == 4 and statuses(batch_id) == {"queued": 6}
    window_closes(batch_id)
    reap_once()
    with transaction() as session:
        origin = session.get(Batch, batch_id)
        assert origin is not None
        child = session.scalars(select(Batch).where(Batch.retry_of == batch_id)).one()
        assert (child.completion_window, child.retry_root, child.request_total) == (BACKGROUND_WINDOW, batch_id, 6)
        copies = session.execute(
            select(BatchRequest.id, BatchRequest.custom_id).where(BatchRequest.batch_id == child.id)
        )
        assert {custom_id: stored_tokens(session, request_id=rid) for rid, custom_id in copies} == saved
        tenant_id = origin.tenant_id
    assert statuses(batch_id) == {"expired": 6}
    assert finalize_batch(get_blob_store(), batch_id=batch_id) == lifecycle.EXPIRED
    assert {line["error"]["code"] for line in file_lines(batch_id, "error")} == {"batch_expired"}

    fresh = make_runner(max_num_seqs=4, worker_id="w2")
    while fresh.run_for(2.0):
        pass
    assert statuses(child.id) == {"completed": 6}
    assert finalize_batch(get_blob_store(), batch_id=child.id) == lifecycle.COMPLETED
    with transaction() as session:
        merged = [orjson.loads(line) for line in merged_results(session, tenant_id=tenant_id, batch_id=batch_id).lines]
    assert sorted(line["custom_id"] for line in merged) == sorted(f"r{i}" for i in range(6))  # each line once
    for line in merged:
        body = line["response"]["body"]
        words = body["choices"][0]["message"]["content"].split()
        assert len(words) == 200 and body["usage"]["completion_tokens"] == 200 and "backfill" not in body
        earlier = saved[line["custom_id"]]
        assert words[: len(earlier)] == _words(earlier).split()  # carried on from its last token, not redone


def test_a_batch_that_continues_in_the_background_is_never_expired_without_its_child(backend: Backend) -> None:
    """The reaper's continuation skips a batch another transaction holds locked (a worker's flush, a claim); its
    plain expiry, later in the same pass, must leave the batch to the next continuation, not end its lines."""
    batch_id = enqueue(3, max_tokens=200)
    with transaction() as session:
        session.execute(update(Batch).where(Batch.id == batch_id).values(on_expiry=CONTINUE_IN_BACKGROUND))
    window_closes(batch_id, seconds_ago=get_settings().expiry_cut_grace_seconds + 1)
    with transaction() as session:  # the pass after a continuation that found the batch locked
        assert expire_overdue(session, grace_seconds=get_settings().expiry_cut_grace_seconds) == []
    assert statuses(batch_id) == {"queued": 3}
    reap_once()  # the next pass continues it
    assert statuses(batch_id) == {"expired": 3}
    with transaction() as session:
        child = session.scalars(select(Batch).where(Batch.retry_of == batch_id)).one()
    assert statuses(child.id) == {"queued": 3}


def test_a_line_handed_back_mid_generation_is_claimed_at_expiry_and_cut_from_its_checkpoint(backend: Backend) -> None:
    batch_id = enqueue(6, max_tokens=10**8)
    slow = FakeEngine("fake-model", max_num_seqs=4, max_model_len=10**9, step_seconds=0.01)
    first = Runner(slow, model="fake-model", settings=get_settings(), worker_id="w1")
    first.run_for(0.3)
    first.hand_back(drain_seconds=0)  # 4 go back with their tokens, 2 never started
    with transaction() as session:
        rows = session.execute(select(BatchRequest.id, BatchRequest.custom_id).where(BatchRequest.batch_id == batch_id))
        saved = {custom_id: stored_tokens(session, request_id=rid) for rid, custom_id in rows}
    window_closes(batch_id)
    reap_once()  # the 2 with nothing generated end now; the 4 holding tokens wait for a worker to cut them
    assert statuses(batch_id) == {"queued": 4, "expired": 2}
    second = make_runner(max_num_seqs=4, worker_id="w2")
    second.run_for(1.0)  # claims them and answers each from its checkpoint at once: nothing decoded past the deadline
    assert statuses(batch_id) == {"completed": 4, "expired": 2}
    with transaction() as session:
        answered = session.execute(
            select(BatchRequest.custom_id, BatchRequest.response_body).where(
                BatchRequest.batch_id == batch_id, BatchRequest.status == lifecycle.REQ_COMPLETED
            )
        ).all()
    for custom_id, body in answered:
        words = body["choices"][0]["message"]["content"].split()
        assert body["backfill"] == {"cut_by": "expiry"} and len(saved[custom_id]) > 0
        assert words == _words(saved[custom_id]).split()  # nothing generated was lost, nothing more was generated
        assert body["usage"]["completion_tokens"] == len(saved[custom_id])


@pytest.mark.backfill_env(
    {"BACKFILL_MODELS": json.dumps({"fake-model": {"path": "fake:"}}), "BACKFILL_TENANT_MAX_OPEN_BATCHES": "1"}
)
def test_a_batch_whose_child_the_quota_refuses_expires_cutting_its_lines_and_says_why(backend: Backend) -> None:
    batch_id = enqueue(3, max_tokens=10**8)  # the tenant's one open batch: no room for a child
    with transaction() as session:
        session.execute(update(Batch).where(Batch.id == batch_id).values(on_expiry=CONTINUE_IN_BACKGROUND))
    runner = make_runner(max_num_seqs=4)
    runner.run_for(0.3)
    window_closes(batch_id)
    reap_once()
    with transaction() as session:
        batch = session.get(Batch, batch_id)
        assert batch is not None and batch.on_expiry is None
        assert [w["code"] for w in batch.warnings or []] == ["not_continued"]
        assert session.scalars(select(Batch).where(Batch.retry_of == batch_id)).all() == []
    runner.run_for(0.5)
    assert statuses(batch_id) == {"completed": 3}  # cut short, as without the option
