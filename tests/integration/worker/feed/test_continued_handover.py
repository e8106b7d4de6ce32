"""A batch that continues in the background takes its lines from under their worker (issue 40): the reaper ends the
origin's rows and copies them into a child at once, each copy from the row's last stored checkpoint. What the worker
held past that checkpoint (an answer finished but not yet stored, tokens generated since) goes to the copy when the
worker learns its row is gone, so the child decodes again only the answer's last token, not the whole answer."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import pytest
from sqlalchemy import select, update

from storage.db import transaction
from storage.models import Batch, BatchRequest
from storage.queue.checkpoints import stored_tokens
from storage.queue.expiry import CONTINUE_IN_BACKGROUND
from storage.settings import get_settings
from tests.conftest import Backend
from tests.integration.worker.feed.test_checkpoints import finish
from tests.integration.worker.feed.test_expiry_cuts import reap_once, window_closes
from tests.integration.worker.feed.test_runner import enqueue
from worker.engine import EngineRequest, EngineResult
from worker.engine.fake import FakeEngine, _words
from worker.feed import writes
from worker.feed.runner import Runner

pytestmark = pytest.mark.backfill_env(
    {
        "BACKFILL_MODELS": json.dumps({"fake-model": {"path": "fake:"}}),
        "BACKFILL_CHECKPOINT_EVERY_TOKENS": "8",
        "BACKFILL_CHECKPOINT_INTERVAL_SECONDS": "0.1",
    }
)


@pytest.fixture(autouse=True)
def one_claim_while_busy(monkeypatch: pytest.MonkeyPatch) -> None:
    """A busy runner claims again only when its engine is idle: none of the child's rows reaches the first worker."""
    monkeypatch.setattr("worker.feed.runner.IDLE_CLAIM_SECONDS", 3600.0)


def continuing(n: int, *, max_tokens: int) -> str:
    """A batch of `n` lines that continues in the background when its window closes."""
    batch_id = enqueue(n, max_tokens=max_tokens)
    with transaction() as session:
        session.execute(update(Batch).where(Batch.id == batch_id).values(on_expiry=CONTINUE_IN_BACKGROUND))
    return batch_id


def copies_of(batch_id: str) -> dict[str, tuple[str, list[int]]]:
    """The child's copies: origin row id -> (copy id, the copy's checkpoint)."""
    with transaction() as session:
        child = session.scalars(select(Batch.id).where(Batch.retry_of == batch_id)).one()
        rows = session.execute(select(BatchRequest.id, BatchRequest.copy_of).where(BatchRequest.batch_id == child))
        return {str(source): (rid, stored_tokens(session, request_id=rid)) for rid, source in rows}


def answers_of(batch_id: str) -> dict[str, list[str]]:
    """Copy id -> the words of its stored answer."""
    with transaction() as session:
        child = session.scalars(select(Batch.id).where(Batch.retry_of == batch_id)).one()
        rows = session.execute(
            select(BatchRequest.id, BatchRequest.response_body).where(BatchRequest.batch_id == child)
        )
        return {rid: body["choices"][0]["message"]["content"].split() for rid, body in rows}


class ContinuedAsItFinishes(FakeEngine):
    """The window closes and the reaper continues the batch inside the step that finishes its lines: their results
    reach the database after their rows went to the child."""

    def __init__(self, batch_id: str) -> None:
        super().__init__("fake-model", max_num_seqs=4, max_model_len=10**9)
        self.batch_id = batch_id
        self.answers: dict[str, list[int]] = {}
        self.stop = threading.Event()  # set once the batch continued: the runner claims none of the child's rows

    def step(self) -> list[EngineResult]:
        results = super().step()
        if results and not self.stop.is_set():
            window_closes(self.batch_id)
            reap_once()
            self.answers.update((result.request_id, list(result.token_ids)) for result in results)
            self.stop.set()
        return results


def test_answers_finished_as_their_batch_continued_in_the_background_leave_the_child_only_their_last_token(
    backend: Backend,
) -> None:
    batch_id = continuing(2, max_tokens=20)
    engine = ContinuedAsItFinishes(batch_id)
    runner = Runner(engine, model="fake-model", settings=get_settings(), worker_id="w1")
    runner.run_for(60.0, stop=engine.stop)  # stores what it finished, claims nothing more
    runner.close_io()
    copies = copies_of(batch_id)
    assert sorted(copies) == sorted(engine.answers) and len(copies) == 2  # both went to the child unanswered
    for origin, (_, tokens) in copies.items():
        assert tokens == engine.answers[origin][:-1]  # the finished answer but its last token

    second = FakeEngine("fake-model", max_num_seqs=4, max_model_len=10**9)
    finish(Runner(second, model="fake-model", settings=get_settings(), worker_id="w2"))
    assert second.steps == 1  # only the last token is decoded again
    answers = answers_of(batch_id)
    for copy, tokens in copies.values():
        assert len(answers[copy]) == 20 and answers[copy][:19] == _words(tokens).split()


class ContinuedMidway(FakeEngine):
    """At step `at` the reaper continues the batch while its lines are generating; `aborted` is set (with each line's
    tokens then) when the runner lets them go."""

    def __init__(self, batch_id: str, *, at: int, step_seconds: float = 0.002) -> None:
        super().__init__("fake-model", max_num_seqs=4, max_model_len=10**9, step_seconds=step_seconds)
        self.batch_id, self.at = batch_id, at
        self.aborted = threading.Event()
        self.held: dict[str, list[int]] = {}
        self.resumed: dict[str, list[int]] = {}  # request id -> the tokens it entered the engine with

    def add(self, request: EngineRequest) -> EngineResult | None:
        self.resumed[request.request_id] = list(request.resume_token_ids or [])
        return super().add(request)

    def step(self) -> list[EngineResult]:
        results = super().step()
        if self.steps == self.at:
            window_closes(self.batch_id)
            reap_once()
        return results

    def abort(self, request_ids: list[str]) -> None:
        self.held.update((rid, p.token_ids) for rid, p in self.progress(request_ids).items())
        super().abort(request_ids)
        if request_ids:
            self.aborted.set()


def test_lines_generating_when_their_batch_continued_hand_the_child_every_token_their_worker_held(
    backend: Backend,
) -> None:
    batch_id = continuing(2, max_tokens=3000)
    engine = ContinuedMidway(batch_id, at=15)
    runner = Runner(engine, model="fake-model", settings=get_settings(), worker_id="w1")
    runner.run_for(60.0, stop=engine.aborted)  # its next renewal finds the rows gone: they leave the engine
    runner.close_io()
    copies = copies_of(batch_id)
    assert sorted(copies) == sorted(engine.held)
    for origin, (_, tokens) in copies.items():
        assert len(engine.held[origin]) > 15 and tokens == engine.held[origin]  # past the continuation's checkpoint

    second = FakeEngine("fake-model", max_num_seqs=4, max_model_len=10**9)
    finish(Runner(second, model="fake-model", settings=get_settings(), worker_id="w2"))
    assert second.steps == 3000 - min(len(tokens) for tokens in engine.held.values())  # nothing decoded twice


def test_the_worker_that_let_a_continued_line_go_claims_its_copy_only_once_the_copy_holds_its_tokens(
    backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its engine is idle once the lines leave it, so it claims at once: the claim must not lease the copies before
    the write handing them the tokens lands (a write made slow here), or they would start from their checkpoint."""
    hand_back = writes.hand_back

    def slow_hand_back(item: writes.HandBack, **kwargs: Any) -> None:
        time.sleep(0.5)
        hand_back(item, **kwargs)

    monkeypatch.setattr(writes, "hand_back", slow_hand_back)
    batch_id = continuing(2, max_tokens=1000)
    engine = ContinuedMidway(batch_id, at=15, step_seconds=0.004)
    runner = Runner(engine, model="fake-model", settings=get_settings(), worker_id="w1")
    finish(runner)  # the origin's lines until its renewal finds them gone, then their copies
    copies = copies_of(batch_id)
    assert sorted(copies) == sorted(engine.held) and len(copies) == 2
    for origin, (copy, _) in copies.items():
        assert len(engine.held[origin]) > 15 and engine.resumed[copy] == engine.held[origin]
