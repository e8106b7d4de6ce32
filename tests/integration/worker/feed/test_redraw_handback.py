"""A checked line handed back between draws (a pause, a drain) keeps the draws it made (issue 40, section 2): the
next claim goes on with the next draw, so a line never makes more than `max_attempts` draws in all, its result
lists every draw it made across claims, and failed draws are billed as the operator says over all of them."""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from typing import Any

import pytest
from sqlalchemy import update

from storage.db import transaction
from storage.models import Batch, BatchRequest
from storage.queue.claim import ClaimedRequest
from storage.settings import get_settings
from tests.conftest import Backend
from tests.integration.worker.feed.test_checkpoints import finish, rows_of
from tests.integration.worker.feed.test_expiry_cuts import window_closes
from tests.integration.worker.feed.test_pause_handback import control
from tests.integration.worker.feed.test_runner import enqueue
from worker.engine import EngineRequest, EngineResult
from worker.engine.fake import FakeEngine
from worker.feed.redraws import redraw_seed
from worker.feed.runner import Runner

pytestmark = pytest.mark.backfill_env(
    {
        "BACKFILL_MODELS": json.dumps({"fake-model": {"path": "fake:"}}),
        "BACKFILL_CHECKPOINT_EVERY_TOKENS": "8",
        "BACKFILL_CHECKPOINT_INTERVAL_SECONDS": "0.1",
    }
)

TOKENS = 300


class Scripted(FakeEngine):
    """The fake engine answering "no" to a line's first draw and "yes" to a redraw (one with a seed of its own);
    it counts each draw it finishes, and sets `redrawn` once a redraw is in it (then each step takes 10 ms, so a
    pause's renewal finds the redraw still running) and `aborted` when the runner takes lines back."""

    def __init__(self) -> None:
        super().__init__("fake-model", max_num_seqs=4, max_model_len=10**9)
        self.seeds: dict[str, list[int | None]] = {}
        self.finished: Counter[str] = Counter()
        self.redrawn, self.aborted = threading.Event(), threading.Event()

    def add(self, request: EngineRequest) -> EngineResult | None:
        self.seeds.setdefault(request.request_id, []).append(request.seed)
        if request.seed is not None:
            self.redrawn.set()
        return super().add(request)

    def step(self) -> list[EngineResult]:
        if self.redrawn.is_set():
            time.sleep(0.01)
        results = super().step()
        for result in results:
            self.finished[result.request_id] += 1
            seeded = self.seeds[result.request_id][-1] is not None
            result.body["choices"][0]["message"]["content"] = "yes" if seeded else "no"
        return results

    def abort(self, request_ids: list[str]) -> None:
        super().abort(request_ids)
        if request_ids:
            self.aborted.set()


def checked_line(checks: dict[str, Any]) -> str:
    batch_id = enqueue(1, max_tokens=TOKENS)
    with transaction() as session:
        session.execute(update(Batch).where(Batch.id == batch_id).values(checks=checks))
    return batch_id


def first_draw_then_hand_back(batch_id: str, how: str) -> Scripted:
    """Worker w1 draws the line once (its answer fails), starts the redraw, and hands the line back mid-redraw."""
    engine = Scripted()
    runner = Runner(engine, model="fake-model", settings=get_settings(), worker_id="w1")
    runner.run_for(60.0, stop=engine.redrawn)
    if how == "pause":
        control(batch_id, "pause")
        runner.run_for(60.0, stop=engine.aborted)  # its next renewal finds the pause: the line goes back
        runner.close_io()
        control(batch_id, "resume")
    else:  # a graceful stop: the worker hands its leases back
        assert runner.hand_back(drain_seconds=0.0) == 1
        runner.close_io()
    [row] = rows_of(batch_id)
    assert row.status == "queued" and engine.finished[row.id] == 1 and row.response_body is None
    return engine


def second_worker_finishes() -> Scripted:
    engine = Scripted()
    finish(Runner(engine, model="fake-model", settings=get_settings(), worker_id="w2"))
    return engine


@pytest.mark.parametrize("how", ["pause", "drain"])
def test_a_line_handed_back_mid_redraw_goes_on_with_its_next_draw_on_the_next_claim(backend: Backend, how: str) -> None:
    batch_id = checked_line({"regex": "yes", "max_attempts": 2})
    first = first_draw_then_hand_back(batch_id, how)
    second = second_worker_finishes()

    [row] = rows_of(batch_id)
    assert row.status == "completed" and row.response_body is not None
    assert row.response_body["choices"][0]["message"]["content"] == "yes"
    assert second.seeds[row.id] == [redraw_seed(_claimed(row), 2)]  # the second draw, not the first again
    assert first.finished[row.id] + second.finished[row.id] == 2  # two draws in all: max_attempts
    attempts = row.check_attempts
    assert attempts is not None and attempts["count"] == 2
    assert [(f["attempt"], f["check"]) for f in attempts["failed"]] == [(1, "regex")]  # made by w1, listed by w2
    assert row.completion_tokens == 2 * TOKENS  # the operator bills failed draws (default): both, once each


@pytest.mark.backfill_env(
    {
        "BACKFILL_MODELS": json.dumps({"fake-model": {"path": "fake:"}}),
        "BACKFILL_CHECKS_BILL_FAILED_ATTEMPTS": "false",
    }
)
def test_a_line_no_draw_satisfies_across_claims_ends_checks_failed_after_max_attempts_draws(backend: Backend) -> None:
    batch_id = checked_line({"regex": "never", "max_attempts": 3})
    first = first_draw_then_hand_back(batch_id, "drain")
    second = second_worker_finishes()

    [row] = rows_of(batch_id)
    assert row.status == "failed" and row.error_code == "checks_failed"
    assert second.seeds[row.id] == [redraw_seed(_claimed(row), 2), redraw_seed(_claimed(row), 3)]
    assert first.finished[row.id] + second.finished[row.id] == 3
    attempts = row.check_attempts
    assert attempts is not None and attempts["count"] == 3
    assert [f["attempt"] for f in attempts["failed"]] == [1, 2, 3]
    assert row.completion_tokens == TOKENS  # failed draws not billed: the last answer's tokens only


def _claimed(row: BatchRequest) -> ClaimedRequest:
    """The row as `redraw_seed` reads it (its id and body)."""
    return ClaimedRequest(row.id, row.batch_id, row.tenant_id, row.url, row.body, row.deadline)


def test_a_checked_line_cut_at_expiry_mid_redraw_keeps_its_failed_draw_and_is_billed_for_it(backend: Backend) -> None:
    batch_id = checked_line({"regex": "yes", "max_attempts": 3})
    engine = Scripted()
    runner = Runner(engine, model="fake-model", settings=get_settings(), worker_id="w1")
    runner.run_for(60.0, stop=engine.redrawn)  # the first draw failed; the second is in the engine
    window_closes(batch_id)
    runner.run_for(60.0, stop=engine.aborted)  # its next renewal finds the window closed: cut short
    runner.close_io()

    [row] = rows_of(batch_id)
    assert row.status == "completed" and row.response_body is not None
    assert row.response_body["backfill"] == {"cut_by": "expiry"}
    cut = row.response_body["usage"]["completion_tokens"]
    assert 0 < cut < TOKENS and engine.finished[row.id] == 1  # cut mid-way through its second draw
    attempts = row.check_attempts
    assert attempts is not None and attempts["count"] == 2
    assert [(f["attempt"], f["check"]) for f in attempts["failed"]] == [(1, "regex")]
    assert row.completion_tokens == TOKENS + cut  # the failed draw billed (the default), and what the cut kept
