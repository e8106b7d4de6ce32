"""The runner's ledger: every state move a held request can make, and none it cannot (worker/feed/ledger.py)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from storage.queue.claim import ClaimedRequest
from worker.engine import EngineResult
from worker.feed.ledger import IllegalMove, Ledger, State

CLAIMED, RUNNING, FINISHED, RECORDING = State.CLAIMED, State.RUNNING, State.FINISHED, State.RECORDING
EVERY_STATE: list[State | None] = [None, CLAIMED, RUNNING, FINISHED, RECORDING]  # None: not held


def row(request_id: str, *, urgent: bool = False, capped: bool = False) -> ClaimedRequest:
    return ClaimedRequest(
        id=request_id, batch_id="batch_1", tenant_id="t", url="/v1/chat/completions", body={}, deadline=0,
        urgent=urgent, capped=capped,
    )  # fmt: skip


def result(request_id: str) -> EngineResult:
    return EngineResult(request_id, 200, {"id": request_id})


def ledger_with(*held: tuple[str, State], urgent: bool = False, capped: bool = False) -> Ledger:
    """A ledger holding each id in its state, reached by the moves a runner makes."""
    ledger = Ledger()
    for request_id, state in sorted(held, key=lambda item: item[1] is not RECORDING):  # hand_over takes every result
        ledger.claim(row(request_id, urgent=urgent, capped=capped))
        if state is not CLAIMED:
            ledger.admit(request_id)
        if state in (FINISHED, RECORDING):
            ledger.finish([result(request_id)])
        if state is RECORDING:
            ledger.hand_over()
    return ledger


# Each move on one request: what it does, the states it may start from, and where it leaves the request
# ("same": where it was; None: no longer held).
MOVES: dict[str, tuple[Callable[[Ledger, str], object], set[State | None], State | str | None]] = {
    "claim": (lambda ledger, rid: ledger.claim(row(rid)), {None}, CLAIMED),
    "admit": (lambda ledger, rid: ledger.admit(rid), {CLAIMED}, RUNNING),
    "refuse": (lambda ledger, rid: ledger.refuse(result(rid)), {CLAIMED}, FINISHED),
    "finish": (lambda ledger, rid: ledger.finish([result(rid)]), {RUNNING}, FINISHED),
    "recorded": (lambda ledger, rid: ledger.recorded([rid]), {RECORDING}, None),
    "lose": (lambda ledger, rid: ledger.lose([rid]), {RUNNING}, None),
    "pause": (lambda ledger, rid: ledger.pause([rid]), {RUNNING}, None),
    "relet": (lambda ledger, rid: ledger.relet(rid), {RUNNING, FINISHED, RECORDING}, "same"),
}


@pytest.mark.parametrize("start", EVERY_STATE, ids=lambda s: getattr(s, "name", "not held"))
@pytest.mark.parametrize("move", sorted(MOVES))
def test_each_move_goes_where_it_says_from_the_states_it_allows_and_refuses_every_other(
    move: str, start: State | None
) -> None:
    make, sources, target = MOVES[move]
    ledger = ledger_with(("a", start)) if start is not None else Ledger()
    if start in sources:
        make(ledger, "a")
        assert ledger.state("a") == (start if target == "same" else target)
    else:
        with pytest.raises(IllegalMove, match=move):
            make(ledger, "a")
        assert ledger.state("a") == start  # a refused move changes nothing


@pytest.mark.parametrize("start", EVERY_STATE[1:], ids=lambda s: getattr(s, "name", "not held"))
def test_hand_over_takes_every_finished_result_to_the_writer_and_nothing_else(start: State) -> None:
    ledger = ledger_with(("a", start), ("f", FINISHED))
    assert [r.request_id for r in ledger.hand_over()] == (["a", "f"] if start is FINISHED else ["f"])
    assert ledger.state("a") == (RECORDING if start is FINISHED else start)
    assert ledger.state("f") is RECORDING and ledger.hand_over() == []


@pytest.mark.parametrize("start", EVERY_STATE[1:], ids=lambda s: getattr(s, "name", "not held"))
def test_a_hand_back_lets_go_of_claimed_and_running_requests_and_keeps_results(start: State) -> None:
    ledger = ledger_with(("a", start))
    released = ledger.hand_back()
    assert released == (["a"] if start in (CLAIMED, RUNNING) else [])
    assert ledger.state("a") == (None if start in (CLAIMED, RUNNING) else start)


def test_a_request_s_whole_life_and_what_is_held_and_renewed_at_each_step() -> None:
    ledger = Ledger()
    seen: list[tuple[State | None, bool, list[str], bool]] = []

    def note() -> None:
        seen.append((ledger.state("a"), "a" in ledger.held(), ledger.to_renew(), "a" in ledger.running()))

    ledger.claim(row("a"))
    note()
    ledger.admit("a")
    note()
    ledger.finish([result("a")])
    note()
    assert [r.request_id for r in ledger.hand_over()] == ["a"]
    note()
    ledger.recorded(["a"])
    note()
    assert seen == [
        (CLAIMED, True, ["a"], False),
        (RUNNING, True, ["a"], True),
        (FINISHED, True, ["a"], False),
        (RECORDING, True, [], False),  # with the writer: its commit comes before any later renewal
        (None, False, [], False),
    ]


def test_results_go_to_the_writer_in_the_order_they_finished_refused_ones_included() -> None:
    ledger = ledger_with(("b", RUNNING), ("c", RUNNING))
    ledger.finish([result("c")])
    ledger.claim(row("a"))
    ledger.refuse(EngineResult("a", 400, {"error": "bad"}))
    ledger.finish([result("b")])
    assert [(r.request_id, r.status_code) for r in ledger.hand_over()] == [("c", 200), ("a", 400), ("b", 200)]
    assert (ledger.count(FINISHED), ledger.count(RECORDING)) == (0, 3)


def test_a_move_with_one_request_it_cannot_make_moves_none() -> None:
    ledger = ledger_with(("a", RUNNING), ("b", FINISHED))
    with pytest.raises(IllegalMove, match="lose of 1 request"):
        ledger.lose(["a", "b"])
    with pytest.raises(IllegalMove):
        ledger.finish([result("a"), result("b")])
    assert (ledger.state("a"), ledger.state("b")) == (RUNNING, FINISHED)
    assert [r.request_id for r in ledger.hand_over()] == ["b"]  # b's result was not replaced


def test_a_request_finishing_twice_or_claimed_while_held_is_refused() -> None:
    ledger = ledger_with(("a", RUNNING))
    ledger.finish([result("a")])
    with pytest.raises(IllegalMove):
        ledger.finish([result("a")])
    with pytest.raises(IllegalMove, match="claim"):
        ledger.claim(row("a"))  # a claim of a held row is a re-lease (`relet`), never a second copy


def test_urgency_lasts_while_an_urgent_request_is_in_the_engine() -> None:
    ledger = ledger_with(("a", CLAIMED), ("b", CLAIMED), ("c", CLAIMED), ("d", CLAIMED), urgent=True)
    assert not ledger.urgent()  # claimed, not yet in the engine
    for rid in "abcd":
        ledger.admit(rid)
    assert ledger.urgent()
    ledger.finish([result("a")])
    ledger.lose(["b"])
    ledger.pause(["c"])
    assert ledger.urgent()
    ledger.hand_back()
    assert not ledger.urgent()
    ledger.claim(row("b", urgent=False))  # gone and claimed back: urgency is the new claim's
    ledger.admit("b")
    assert not ledger.urgent() and not ledger_with(("x", RUNNING)).urgent()


def test_a_capped_result_waiting_for_a_flush_is_flushed_at_once_until_handed_over() -> None:
    ledger = ledger_with(("a", RUNNING), ("b", CLAIMED), capped=True)
    assert not ledger.capped_finished()
    ledger.finish([result("a")])
    assert ledger.capped_finished()
    ledger.hand_over()
    assert not ledger.capped_finished()
    ledger.refuse(result("b"))  # refused at once by the engine: its error line is capped work too
    assert ledger.capped_finished()
    ledger.hand_over()
    ledger.recorded(["a", "b"])
    ledger.claim(row("a"))
    ledger.admit("a")
    ledger.finish([result("a")])
    assert not ledger.capped_finished()  # claimed back uncapped: the old claim's flag is gone
    assert not ledger_with(("u", FINISHED)).capped_finished()


def test_a_relet_request_keeps_its_state_and_its_result() -> None:
    ledger = ledger_with(("a", RUNNING), ("b", FINISHED), ("c", RECORDING))
    for rid in "abc":
        ledger.relet(rid)
    assert [ledger.state(rid) for rid in "abc"] == [RUNNING, FINISHED, RECORDING]
    assert [r.request_id for r in ledger.hand_over()] == ["b"]
    assert ledger.held() == {"a", "b", "c"} and ledger.to_renew() == ["a"]
