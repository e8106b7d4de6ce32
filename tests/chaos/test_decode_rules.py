"""The checker's decode rule (issue 21) on synthetic histories: graceful runs discard at most 1% of their decode
tokens, kill -9 runs at most the checkpoint bound per killed request; the ledger is read back from its files."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import pytest

from tests.chaos.decode_rules import class_shares, decode_summary, record_decode
from tests.chaos.history import FaultRecord, History, check
from tests.chaos.synthetic_histories import T0, clean_history
from worker.engine.decode_ledger import DecodeFigures, DecodeLedger

BOUND = 20  # tokens a killed request may lose, in these histories


def with_decode(faults: list[str], *, discarded: dict[str, int], unaccounted: int = 0, reruns: int = 0) -> History:
    """The clean history (a and b delivered 5 tokens each) whose engines decoded 5 + `discarded` per request."""
    history = clean_history()
    history.faults = [FaultRecord(kind, "gpu1", T0 + 2 + i, T0 + 3 + i) for i, kind in enumerate(faults)]
    history.checkpoint_bound_tokens = BOUND
    thrown = sum(discarded.values())
    figures = DecodeFigures(
        decoded=10 + thrown,
        delivered=10,
        resumed=0,
        discarded=thrown,
        undelivered_decoded=0,
        undelivered_requests=0,
        unaccounted=unaccounted,
        rerun_results=reruns,
        discarded_by_request=discarded,
    )
    history.decode = asdict(figures)
    return history


def kinds(history: History) -> dict[str, int]:
    return {kind: n for kind, n in check(history).summary().items() if n}


def test_a_graceful_run_that_resumed_everything_passes() -> None:
    assert kinds(with_decode(["sigterm_gpu"], discarded={})) == {}


@pytest.mark.parametrize("faults", [["sigterm_gpu"], [], ["kill_api", "s3_down_upload"]])
def test_a_graceful_run_that_threw_decode_away_is_a_finding(faults: list[str]) -> None:
    history = with_decode(faults, discarded={"batch_req_a": 1})  # 1 of 11 tokens: 9%
    assert kinds(history) == {"discarded": 1}


def test_a_result_a_pause_handed_back_may_cost_its_last_token_and_no_more() -> None:
    assert kinds(with_decode([], discarded={"batch_req_a": 1}, reruns=1)) == {}
    assert kinds(with_decode([], discarded={"batch_req_a": 2}, reruns=1)) == {"discarded": 1}


def test_a_kill_run_within_the_checkpoint_bound_passes() -> None:
    history = with_decode(["kill_gpu"], discarded={"batch_req_a": BOUND, "batch_req_b": BOUND})
    assert kinds(history) == {}


def test_a_kill_run_that_lost_more_than_the_bound_is_a_finding() -> None:
    history = with_decode(["kill_gpu"], discarded={"batch_req_a": BOUND + 1})
    verdict = check(history)
    assert {f.kind for f in verdict.findings} == {"discarded"}
    assert "batch_req_a 21" in verdict.findings[0].detail


def test_each_kill_may_cost_a_request_the_bound_again() -> None:
    history = with_decode(["kill_gpu", "kill_gpu"], discarded={"batch_req_a": 2 * BOUND})
    assert kinds(history) == {}


def test_a_run_with_a_postgres_stop_is_reported_not_judged() -> None:
    history = with_decode(["kill_gpu", "pg_stop"], discarded={"batch_req_a": 10 * BOUND})
    assert kinds(history) == {}
    assert decode_summary(history)["class"] == "other"


def test_delivered_tokens_no_ledger_decoded_are_a_finding() -> None:
    assert kinds(with_decode(["sigterm_gpu"], discarded={}, unaccounted=5)) == {"other": 1}


def test_the_ledger_files_of_two_processes_make_the_run_figures(tmp_path: Path) -> None:
    """Worker 1 decoded 3 tokens of a, checkpointed 2 of them and was SIGTERM'd; worker 2 resumed a from 2
    (and decoded 3 more) and ran b whole; c failed at once. One token of a was decoded twice."""
    first, second = DecodeLedger(tmp_path, model="m"), DecodeLedger(tmp_path, model="m")
    first.begin("batch_req_a", resumed=0, choices=1)
    for _ in range(3):
        first.step(["batch_req_a"])
    first.abort(["batch_req_a"])
    second.begin("batch_req_a", resumed=2, choices=1)
    second.begin("batch_req_b", resumed=0, choices=1)
    second.step(["batch_req_a", "batch_req_b"])
    second.step(["batch_req_a", "batch_req_b"])
    second.step(["batch_req_a", "batch_req_b"])
    second.finish("batch_req_a", tokens=5)
    for _ in range(2):
        second.step(["batch_req_b"])
    second.finish("batch_req_b", tokens=5)
    history = clean_history()
    history.faults = [FaultRecord("sigterm_gpu", "gpu1", T0 + 2, T0 + 3)]
    record_decode(history, tmp_path)
    assert decode_summary(history) == {
        "class": "graceful",
        "decoded": 11,
        "delivered": 10,
        "resumed": 2,
        "discarded": 1,
        "undelivered_decoded": 0,
        "rerun_results": 0,
    }
    assert kinds(history) == {"discarded": 1}  # 1 of 11: over 1%


def test_no_ledger_no_figures(tmp_path: Path) -> None:
    history = clean_history()
    record_decode(history, tmp_path)
    assert history.decode is None and decode_summary(history) == {} and kinds(history) == {}


def test_the_shares_over_runs_are_per_class() -> None:
    runs = [
        decode_summary(with_decode(["sigterm_gpu"], discarded={})),
        decode_summary(with_decode([], discarded={"batch_req_a": 2})),
        decode_summary(with_decode(["kill_gpu"], discarded={"batch_req_a": 8})),
        {},  # a run on the real engine: no ledger
    ]
    shares = class_shares(runs)
    assert shares["graceful"] == {"runs": 2, "decoded": 22, "discarded": 2, "resumed": 0, "share": round(2 / 22, 5)}
    assert shares["kill"]["share"] == round(8 / 18, 5) and shares["other"]["share"] is None
