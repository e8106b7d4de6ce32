"""What a runner holds, request by request: the one owner of every request id it answers for (docs/workers.md).

Each id is in one state at a time and moves only through the methods below, each of which checks that the move
is legal (`IllegalMove` otherwise: a bug in the runner, never something the database or the engine did):

    claim      (not held) -> CLAIMED    a claim leased the row and the engine thread took it from the claimer
    admit      CLAIMED -> RUNNING       the engine took it in
    refuse     CLAIMED -> FINISHED      the engine refused it at once: its error result waits like any other
    finish     RUNNING -> FINISHED      its result came out of an engine step
    hand_over  FINISHED -> RECORDING    its result went to the writer thread with a flush
    recorded   RECORDING -> (gone)      the writer committed the flush, or dropped it with a failed commit
    lose       RUNNING -> (gone)        its lease is gone (cancelled, expired, leased elsewhere): aborted
    pause      RUNNING -> (gone)        its batch was paused: handed back with its tokens
    hand_back  CLAIMED, RUNNING -> (gone)   a drain, a switch, a stop: released with their tokens
    relet      (held) -> (unchanged)    this worker's own claim leased back a row it still holds (the reaper had
                                        re-queued it): the same work, under the new claim

A row paused or handed back leaves the ledger when its release is queued, not when it is written: the writer
works in order, so any claim that brings the row back (after a resume) lands later, and must start it again
rather than pass for a re-lease. The ledger lives on the engine thread; the I/O threads report to it through the
runner (worker/feed/queue_io.py), never touch it.
"""

from __future__ import annotations

import enum
from collections.abc import Collection, Iterable

from storage.queue.claim import ClaimedRequest
from worker.engine import EngineResult


class State(enum.Enum):
    """Where a held request is."""

    CLAIMED = enum.auto()  # leased by a claim, taken from the claimer thread, not yet in the engine
    RUNNING = enum.auto()  # in the engine
    FINISHED = enum.auto()  # its result waits for the next flush
    RECORDING = enum.auto()  # its result is with the writer thread, not yet reported committed


class IllegalMove(RuntimeError):
    """A move from a state it cannot leave that way (or of an id the ledger does not hold)."""


_ENGINE_SIDE = (State.CLAIMED, State.RUNNING, State.FINISHED)


class Ledger:
    """The request ids one runner holds, by state; the results waiting for a flush; which are urgent or capped."""

    def __init__(self) -> None:
        self._state: dict[str, State] = {}
        self._ids: dict[State, set[str]] = {state: set() for state in State}
        self._results: dict[str, EngineResult] = {}  # FINISHED: the result, in the order they finished
        self._urgent: set[str] = set()  # CLAIMED or RUNNING, claimed inside its deadline's urgency horizon
        self._capped: set[str] = set()  # not yet with the writer, of a capped batch or a budgeted tenant

    # --- what is held -------------------------------------------------------------------------------

    def held(self) -> frozenset[str]:
        """Every request this runner answers for: claimed, in the engine, finished, or with the writer."""
        return frozenset(self._state)

    def to_renew(self) -> list[str]:
        """The leases a renewal queued now renews: held, less the results with the writer. The writer works in
        order, so their commits are done before the renewal runs; it would find them lost and take back a row that
        `record` handed back (a paused batch, resumed since), leased to this worker with nothing running it."""
        return sorted(rid for rid, state in self._state.items() if state in _ENGINE_SIDE)

    def holds(self, request_id: str) -> bool:
        """True if the request is held, in any state."""
        return request_id in self._state

    def state(self, request_id: str) -> State | None:
        """Where the request is (None: not held)."""
        return self._state.get(request_id)

    def running(self) -> frozenset[str]:
        """The requests in the engine now."""
        return frozenset(self._ids[State.RUNNING])

    def running_among(self, request_ids: Iterable[str]) -> set[str]:
        """Those of these requests that are in the engine now."""
        return self._ids[State.RUNNING].intersection(request_ids)

    def count(self, state: State) -> int:
        """How many requests are in `state`."""
        return len(self._ids[state])

    def urgent(self) -> bool:
        """True while a request claimed inside its deadline's urgency horizon is in the engine."""
        return bool(self._urgent & self._ids[State.RUNNING])

    def capped_finished(self) -> bool:
        """True if a finished result waiting for a flush is of a capped batch or budgeted tenant (flushed at once)."""
        return any(self._state[rid] is State.FINISHED for rid in self._capped)

    # --- moves ----------------------------------------------------------------------------------------

    def claim(self, row: ClaimedRequest) -> None:
        """A claimed row the engine thread took: CLAIMED, with its urgency and cap."""
        self._move([row.id], {None}, State.CLAIMED, "claim")
        if row.urgent:
            self._urgent.add(row.id)
        if row.capped:
            self._capped.add(row.id)

    def admit(self, request_id: str) -> None:
        """The engine took a claimed request in."""
        self._move([request_id], {State.CLAIMED}, State.RUNNING, "admit")

    def refuse(self, result: EngineResult) -> None:
        """The engine refused a claimed request at once: its error result waits for the next flush."""
        self._move([result.request_id], {State.CLAIMED}, State.FINISHED, "refuse")
        self._results[result.request_id] = result

    def finish(self, results: Collection[EngineResult]) -> None:
        """Results came out of an engine step: they wait for the next flush."""
        self._move([result.request_id for result in results], {State.RUNNING}, State.FINISHED, "finish")
        self._results.update((result.request_id, result) for result in results)

    def hand_over(self) -> list[EngineResult]:
        """Every finished result, in the order they finished, goes to the writer: they are RECORDING now."""
        results = list(self._results.values())
        self._move(list(self._results), {State.FINISHED}, State.RECORDING, "hand_over")
        return results

    def recorded(self, request_ids: Iterable[str]) -> None:
        """The writer is done with these results (committed, or dropped by a failed commit): no longer held."""
        self._move(request_ids, {State.RECORDING}, None, "recorded")

    def lose(self, request_ids: Iterable[str]) -> None:
        """Their leases are gone: no longer held (the caller aborts them)."""
        self._move(request_ids, {State.RUNNING}, None, "lose")

    def pause(self, request_ids: Iterable[str]) -> None:
        """Their batch was paused: no longer held (the caller aborts them and hands them back with their tokens)."""
        self._move(request_ids, {State.RUNNING}, None, "pause")

    def hand_back(self) -> list[str]:
        """A hand-back: every claimed and running request leaves (the caller releases them); return their ids."""
        ids = sorted(self._ids[State.CLAIMED] | self._ids[State.RUNNING])
        self._move(ids, {State.CLAIMED, State.RUNNING}, None, "hand_back")
        return ids

    def relet(self, request_id: str) -> None:
        """This worker's claim leased back a row it still holds: it stays where it is (never CLAIMED: the engine
        thread takes one claim's rows at a time)."""
        self._check([request_id], {State.RUNNING, State.FINISHED, State.RECORDING}, "relet")

    def _move(self, ids: Iterable[str], sources: Collection[State | None], to: State | None, move: str) -> None:
        """Check that every id may make the move, then make it: all of them or none."""
        ids = self._check(ids, sources, move)
        for rid in ids:
            if (source := self._state.pop(rid, None)) is not None:
                self._ids[source].discard(rid)
            if to is not None:
                self._state[rid] = to
                self._ids[to].add(rid)
        if to not in (State.CLAIMED, State.RUNNING):
            self._urgent.difference_update(ids)
        if to is None or to is State.RECORDING:
            self._capped.difference_update(ids)
            for rid in ids:
                self._results.pop(rid, None)

    def _check(self, ids: Iterable[str], sources: Collection[State | None], move: str) -> list[str]:
        ids = list(dict.fromkeys(ids))
        if wrong := [rid for rid in ids if self._state.get(rid) not in sources]:
            where = ", ".join(f"{rid}: {getattr(self._state.get(rid), 'name', 'not held')}" for rid in wrong[:3])
            raise IllegalMove(f"{move} of {len(wrong)} request(s) from where they are not ({where})")
        return ids
