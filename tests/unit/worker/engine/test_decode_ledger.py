"""The decode ledger (issue 21 item 8): what the fake engines decoded, read back per request after a kill -9."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from worker.engine import EngineRequest, EngineResult
from worker.engine.decode_ledger import DecodeLedger, RequestDecode, decode_figures, read_ledger
from worker.engine.fake import FakeEngine
from worker.engine.timed_fake import TimedFakeEngine

ENGINES = {
    "fake": lambda ledger: FakeEngine(ledger=ledger),
    "gpu-timed": lambda ledger: TimedFakeEngine(max_num_seqs=4, timed=False, ledger=ledger),
}


def chat(rid: str, resume: tuple[int, ...] = (), *, max_tokens: int = 20, **extra: Any) -> EngineRequest:
    body = {"model": "m", "messages": [{"role": "user", "content": "hello"}], "max_tokens": max_tokens, **extra}
    return EngineRequest(rid, "/v1/chat/completions", body, resume)


def finish(engine: FakeEngine) -> dict[str, EngineResult]:
    results: dict[str, EngineResult] = {}
    while engine.has_unfinished():
        results.update((r.request_id, r) for r in engine.step())
    return results


def steps_then_hand_back(engine: FakeEngine, request: EngineRequest, steps: int) -> tuple[int, ...]:
    """Run `steps` steps, then do what a hand-back does: read the generated ids and abort."""
    assert engine.add(request) is None
    for _ in range(steps):
        engine.step()
    token_ids = engine.progress([request.request_id])[request.request_id].token_ids
    engine.abort([request.request_id])
    return tuple(token_ids)


def delivered(results: dict[str, EngineResult]) -> dict[str, int]:
    return {rid: r.completion_tokens for rid, r in results.items() if r.status_code == 200}


@pytest.mark.parametrize("kind", ENGINES)
def test_an_uninterrupted_run_decodes_exactly_what_it_delivers(kind: str, tmp_path: Path) -> None:
    engine = ENGINES[kind](DecodeLedger(tmp_path, model="m"))
    for i in range(6):  # more than the slots: some wait for one
        assert engine.add(chat(f"r{i}", max_tokens=5 + i)) is None
    results = finish(engine)
    figures = decode_figures(read_ledger(tmp_path), delivered(results))
    assert figures.decoded == figures.delivered == sum(5 + i for i in range(6))
    assert (figures.discarded, figures.resumed, figures.share, figures.unaccounted) == (0, 0, 0.0, 0)


@pytest.mark.parametrize("kind", ENGINES)
def test_a_checkpointed_hand_back_resumed_by_another_process_discards_nothing(kind: str, tmp_path: Path) -> None:
    first = ENGINES[kind](DecodeLedger(tmp_path, model="m"))
    done = steps_then_hand_back(first, chat("r1"), 8)
    second = ENGINES[kind](DecodeLedger(tmp_path, model="m"))  # the next worker: a file of its own
    assert second.add(chat("r1", done)) is None
    results = delivered(finish(second))
    figures = decode_figures(read_ledger(tmp_path), results)
    assert (figures.decoded, figures.delivered, figures.resumed, figures.discarded) == (20, 20, len(done), 0)
    assert len(list(tmp_path.iterdir())) == 2


def test_a_restart_from_the_prompt_discards_what_the_first_attempt_decoded(tmp_path: Path) -> None:
    first = FakeEngine(ledger=DecodeLedger(tmp_path, model="m"))
    done = steps_then_hand_back(first, chat("r1"), 8)
    second = FakeEngine(ledger=DecodeLedger(tmp_path, model="m"))
    assert second.add(chat("r1")) is None  # no checkpoint (a kill before any was stored)
    results = delivered(finish(second))
    figures = decode_figures(read_ledger(tmp_path), results)
    assert (figures.decoded, figures.delivered, figures.discarded) == (20 + len(done), 20, len(done))
    assert figures.discarded_by_request == {"r1": len(done)} and figures.share == pytest.approx(8 / 28)


def test_a_request_that_cannot_resume_exactly_counts_every_choice_it_decoded_again(tmp_path: Path) -> None:
    first = FakeEngine(ledger=DecodeLedger(tmp_path, model="m"))
    done = steps_then_hand_back(first, chat("r1", n=2), 5)
    second = FakeEngine(ledger=DecodeLedger(tmp_path, model="m"))
    assert second.add(chat("r1", done, n=2)) is None  # n > 1: the fake restarts it (wire/resume.py)
    results = delivered(finish(second))
    figures = decode_figures(read_ledger(tmp_path), results)
    assert (figures.decoded, figures.delivered, figures.discarded, figures.resumed) == (50, 40, 10, 0)


def test_a_kill_mid_write_loses_only_the_line_it_cut(tmp_path: Path) -> None:
    ledger = DecodeLedger(tmp_path, model="m")
    engine = FakeEngine(ledger=ledger)
    assert engine.add(chat("r1")) is None
    for _ in range(3):
        engine.step()
    with ledger.path.open("ab") as torn:  # the kill came in the middle of the fourth step's write
        torn.write(b"s 1 1")
    read = read_ledger(tmp_path)
    assert read == {"r1": RequestDecode(decoded=3, resumed=0, attempts=1)}


def test_requests_that_end_without_an_output_line_are_counted_apart() -> None:
    ledger = {
        "done": RequestDecode(decoded=30, resumed=10, attempts=2),
        "cancelled": RequestDecode(decoded=12, attempts=1),
    }
    figures = decode_figures(ledger, {"done": 40, "ghost": 5})
    assert (figures.decoded, figures.delivered, figures.discarded, figures.resumed) == (30, 45, 0, 10)
    assert (figures.undelivered_decoded, figures.undelivered_requests) == (12, 1)
    assert figures.unaccounted == 10 + 5  # "done" delivered 10 tokens no engine decoded; "ghost" 5


def test_results_thrown_away_before_the_delivered_one_are_counted() -> None:
    ledger = {"r": RequestDecode(decoded=21, resumed=19, attempts=2, finished=[20, 20])}
    figures = decode_figures(ledger, {"r": 20})
    assert (figures.discarded, figures.rerun_results) == (1, 1)


def test_no_ledger_unless_the_spec_names_a_directory(tmp_path: Path) -> None:
    from storage.registry import ModelSpec
    from worker.engine import timed_fake

    assert timed_fake.from_spec("m", ModelSpec(path=timed_fake.PATH)).ledger is None
    spec = ModelSpec(path=timed_fake.PATH, extra={"decode_ledger_dir": str(tmp_path)})
    engine = timed_fake.from_spec("m", spec)
    assert engine.ledger is not None and engine.ledger.path.parent == tmp_path
