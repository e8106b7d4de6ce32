"""Partial answers at expiry for a paused batch (docs/workflow.md, "Partial answers at expiry"): a line its pause
handed back mid-generation, holding a checkpoint, ends at expiry as a line cut while running does, with the text
generated before the pause (no token after it: a paused batch makes no progress); a line with nothing generated
stays `batch_expired`. With `on_expiry: "continue_in_background"` the lines carry on in a background child, which
starts paused as its origin was."""

from __future__ import annotations

import json

import orjson
import pytest
from sqlalchemy import select, update

from storage import lifecycle
from storage.batches.results import merged_results
from storage.db import transaction
from storage.files.blobs import get_blob_store
from storage.finance.budgets import batch_spend
from storage.models import Batch, BatchRequest
from storage.queue.checkpoints import stored_tokens
from storage.queue.expiry import CONTINUE_IN_BACKGROUND
from storage.settings import get_settings
from storage.windows import BACKGROUND_WINDOW
from tests.conftest import Backend
from tests.integration.worker.feed.test_expiry_cuts import file_lines, reap_once, window_closes
from tests.integration.worker.feed.test_pause_handback import control
from tests.integration.worker.feed.test_runner import enqueue, make_runner, statuses
from worker.engine.fake import FakeEngine, _words
from worker.feed.runner import Runner
from worker.jobs.finalize import finalize_batch

pytestmark = pytest.mark.backfill_env({"BACKFILL_MODELS": json.dumps({"fake-model": {"path": "fake:"}})})


def paused_mid_generation(batch_id: str) -> dict[str, list[int]]:
    """Worker w1 runs 4 of the batch's 6 lines (2 wait, never started) until a pause takes them back with their
    tokens; return each line's stored tokens by custom_id."""
    slow = FakeEngine("fake-model", max_num_seqs=4, max_model_len=10**9, step_seconds=0.01)
    first = Runner(slow, model="fake-model", settings=get_settings(), worker_id="w1")
    first.run_for(0.3)
    control(batch_id, "pause")
    while first.inflight or first.held():  # its next renewal (within 2 s) finds the pause
        first.run_for(0.5)
    first.close_io()
    with transaction() as session:
        rows = session.execute(select(BatchRequest.id, BatchRequest.custom_id).where(BatchRequest.batch_id == batch_id))
        saved = {custom_id: stored_tokens(session, request_id=rid) for rid, custom_id in rows}
    assert statuses(batch_id) == {"queued": 6} and sum(1 for tokens in saved.values() if tokens) == 4
    return saved


def test_a_paused_batchs_lines_holding_tokens_end_at_expiry_with_the_text_generated_before_the_pause(
    backend: Backend,
) -> None:
    batch_id = enqueue(6, max_tokens=10**8)
    saved = paused_mid_generation(batch_id)
    window_closes(batch_id)
    reap_once()  # the 2 with nothing generated end now; the 4 holding tokens wait for a worker to cut them
    assert statuses(batch_id) == {"queued": 4, "expired": 2}
    second = make_runner(max_num_seqs=4, worker_id="w2")
    second.run_for(1.0)
    assert statuses(batch_id) == {"completed": 4, "expired": 2}
    reap_once()
    second.close_io()

    assert finalize_batch(get_blob_store(), batch_id=batch_id) == lifecycle.EXPIRED
    outputs, errors = file_lines(batch_id, "output"), file_lines(batch_id, "error")
    assert sorted(line["custom_id"] for line in outputs + errors) == sorted(saved)  # each line once
    assert sorted(line["custom_id"] for line in outputs) == sorted(cid for cid, tokens in saved.items() if tokens)
    for line in outputs:
        body = line["response"]["body"]
        choice, tokens = body["choices"][0], saved[line["custom_id"]]
        assert line["response"]["status_code"] == 200 and line["error"] is None
        assert choice["finish_reason"] == "length" and body["backfill"] == {"cut_by": "expiry"}
        assert choice["message"]["content"] == _words(tokens)  # what it had at the pause, not a token more
        assert body["usage"]["completion_tokens"] == len(tokens)
    assert {line["error"]["code"] for line in errors} == {"batch_expired"}
    with transaction() as session:
        batch = session.get_one(Batch, batch_id)
        assert batch_spend(session, get_settings(), batch=batch) > 0  # what was generated is billed


def test_a_paused_batch_that_continues_in_the_background_hands_its_lines_to_a_paused_child(backend: Backend) -> None:
    batch_id = enqueue(6, max_tokens=200)
    with transaction() as session:
        session.execute(update(Batch).where(Batch.id == batch_id).values(on_expiry=CONTINUE_IN_BACKGROUND))
    saved = paused_mid_generation(batch_id)
    window_closes(batch_id)
    reap_once()
    with transaction() as session:
        child = session.scalars(select(Batch).where(Batch.retry_of == batch_id)).one()
        assert (child.completion_window, child.request_total) == (BACKGROUND_WINDOW, 6)
        assert child.paused_at is not None  # paused as its origin was: the tenant resumes it
        copies = session.execute(
            select(BatchRequest.id, BatchRequest.custom_id).where(BatchRequest.batch_id == child.id)
        )
        assert {custom_id: stored_tokens(session, request_id=rid) for rid, custom_id in copies} == saved
        tenant_id = session.get_one(Batch, batch_id).tenant_id
    assert statuses(batch_id) == {"expired": 6}
    assert finalize_batch(get_blob_store(), batch_id=batch_id) == lifecycle.EXPIRED

    worker = make_runner(max_num_seqs=4, worker_id="w2")
    worker.run_for(0.5)
    assert statuses(child.id) == {"queued": 6}  # a paused child makes no progress
    control(child.id, "resume")
    while worker.run_for(2.0):
        pass
    worker.close_io()
    assert statuses(child.id) == {"completed": 6}
    assert finalize_batch(get_blob_store(), batch_id=child.id) == lifecycle.COMPLETED
    with transaction() as session:
        merged = [orjson.loads(line) for line in merged_results(session, tenant_id=tenant_id, batch_id=batch_id).lines]
    assert sorted(line["custom_id"] for line in merged) == sorted(saved)  # each line once
    for line in merged:
        words = line["response"]["body"]["choices"][0]["message"]["content"].split()
        earlier = saved[line["custom_id"]]
        assert len(words) == 200 and words[: len(earlier)] == _words(earlier).split()  # carried on, not redone
