"""Redraws on the fake engine (worker/feed/redraws.py): a failing answer is drawn again with a new seed, up to the
batch's limit; the final result carries its attempts; failed attempts are billed as the operator says."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from storage.queue.claim import ClaimedRequest
from storage.queue.draws import Draws
from tests.conftest import reset_caches
from worker.engine import EngineRequest, EngineResult
from worker.engine.fake import FakeEngine
from worker.feed.redraws import Redraws, next_seed, redraw_seed


@pytest.fixture(autouse=True)
def _fresh_settings() -> Iterator[None]:
    """The settings these tests set are read afresh, and dropped after them."""
    reset_caches()
    yield
    reset_caches()


def row(rid: str, checks: dict[str, Any], *, seed: int | None = None) -> ClaimedRequest:
    body: dict[str, Any] = {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    if seed is not None:
        body["seed"] = seed
    return ClaimedRequest(rid, "batch_1", "acme", "/v1/chat/completions", body, 10**10, checks=checks)


def run(rows: list[ClaimedRequest]) -> tuple[list[EngineResult], Redraws]:
    engine = FakeEngine(max_num_seqs=8)
    redraws = Redraws(engine)
    for item in rows:
        assert engine.add(request_of(item)) is None
        redraws.admitted(item)
    final: list[EngineResult] = []
    while engine.has_unfinished():
        done, _ = redraws.screen(engine.step())
        final += done
    return final, redraws


def request_of(item: ClaimedRequest) -> EngineRequest:
    return EngineRequest(request_id=item.id, url=item.url, body=item.body)


def text(result: EngineResult) -> str:
    return str(result.body["choices"][0]["message"]["content"])


def test_a_failing_answer_is_drawn_again_until_it_passes_and_says_how_many_attempts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("BACKFILL_CHECKS_BILL_FAILED_ATTEMPTS", "true")
    reset_caches()
    results, redraws = run([row(f"r{i}", {"regex": "lorem|ipsum", "max_attempts": 5}) for i in range(16)])

    assert len(results) == 16 and redraws.redrawn > 0
    for result in results:
        attempts = result.attempts
        assert attempts is not None and attempts["count"] == len(attempts["failed"]) + (1 if result.ok else 0)
        if result.ok:
            assert text(result) in ("lorem", "ipsum") and result.completion_tokens == attempts["count"]
        else:
            assert (
                result.error_code == "checks_failed"
                and attempts["count"] == 5
                and text(result) not in ("lorem", "ipsum")
            )
    assert any(r.ok and r.attempts and r.attempts["count"] > 1 for r in results)


def test_failed_attempts_cost_nothing_when_the_operator_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BACKFILL_CHECKS_BILL_FAILED_ATTEMPTS", "false")
    reset_caches()
    results, _ = run([row(f"r{i}", {"regex": "lorem|ipsum", "max_attempts": 5}) for i in range(16)])

    assert all(result.completion_tokens == 1 for result in results)
    assert any(r.attempts and r.attempts["count"] > 1 for r in results)


def test_a_line_that_passes_first_time_or_has_no_checks_is_not_drawn_again() -> None:
    results, redraws = run([row("a", {"max_attempts": 3}), row("b", {})])  # "b": its batch has no checks
    by_id = {result.request_id: result for result in results}
    assert redraws.redrawn == 0
    assert by_id["a"].attempts == {"count": 1, "failed": []} and by_id["b"].attempts is None


def test_a_redraw_seed_moves_from_the_line_own_seed_and_differs_per_attempt() -> None:
    seeded = row("a", {}, seed=42)
    assert redraw_seed(seeded, 2) == 42 + 7919 and redraw_seed(seeded, 3) == 42 + 2 * 7919
    unseeded = row("b", {})
    assert len({redraw_seed(unseeded, attempt) for attempt in range(2, 6)}) == 4


def test_a_line_with_draws_from_an_earlier_claim_goes_on_with_the_next_and_counts_and_bills_them_all(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("BACKFILL_CHECKS_BILL_FAILED_ATTEMPTS", "true")
    reset_caches()
    earlier = Draws(
        ({"attempt": 1, "check": "regex", "message": "no match"},),
        {"prompt_tokens": 4, "completion_tokens": 1, "cached_tokens": 0},
    )
    item = replace(row("a", {"regex": "never", "max_attempts": 2}), draws=earlier)
    assert next_seed(item) == redraw_seed(item, 2) and next_seed(row("b", {"max_attempts": 2})) is None
    engine = FakeEngine(max_num_seqs=8)
    redraws = Redraws(engine)
    assert engine.add(EngineRequest(item.id, item.url, item.body, seed=next_seed(item))) is None
    redraws.admitted(item)
    final: list[EngineResult] = []
    while engine.has_unfinished():
        final += redraws.screen(engine.step())[0]

    [result] = final  # its second draw was its last: no third
    assert redraws.redrawn == 0 and result.error_code == "checks_failed"
    assert result.attempts is not None and result.attempts["count"] == 2
    assert [f["attempt"] for f in result.attempts["failed"]] == [1, 2]
    assert result.completion_tokens == 1 + 1  # the earlier claim's failed draw, billed, and this one


def test_a_redraw_of_an_adapter_line_runs_on_its_adapter(tmp_path: Path) -> None:
    """The line otherwise unchanged: a line naming a LoRA adapter is drawn again under that adapter, not the base."""
    (tmp_path / "adapter_config.json").write_text("{}")  # the fake engine "loads" a folder that has one
    engine = FakeEngine(max_num_seqs=8)
    added: list[EngineRequest] = []
    plain_add = engine.add

    def add(request: EngineRequest) -> EngineResult | None:
        added.append(request)
        return plain_add(request)

    engine.add = add  # type: ignore[method-assign]
    redraws = Redraws(engine)
    item = replace(row("r0", {"regex": "^never$", "max_attempts": 2}), adapter="sql-lora", adapter_path=str(tmp_path))
    assert engine.add(replace(request_of(item), adapter=item.adapter, adapter_path=item.adapter_path)) is None
    redraws.admitted(item)
    while engine.has_unfinished():
        redraws.screen(engine.step())
    assert len(added) == 2  # the first draw and its redraw
    assert [(r.adapter, r.adapter_path) for r in added] == [("sql-lora", str(tmp_path))] * 2
    assert added[1].seed == redraw_seed(item, 2)
