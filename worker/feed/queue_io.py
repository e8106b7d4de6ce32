"""The runner's database work off the engine's thread: claims ahead, result commits, lease renewals.

On an 8x H100 node a decode step of a 70B model takes 4-22 ms; a claim or a results transaction on the
engine's thread (tens of ms on a loaded database) would leave the GPU idle for that long (bench/gpu_timed.py).
The runner hands that work to two threads of its own (its only path: there is no inline one):

* the writer commits each flush (results under the lease check, the engine run's counters), renews leases and
  stores checkpoints, in the order handed over, from a bounded queue: when the database falls behind, `submit`
  blocks and the engine waits; nothing piles up without limit;
* the claimer leases the next rows while the engine steps, at most one claim outstanding, and has the engine
  render them ahead (`on_claimed`: `Engine.prepare`, worker/engine/vllm_ahead.py).

Exactly-once is the database's lease check: a result counts only once its transaction commits (`record`
stores it only while this worker holds the lease). Until then its id stays in every renewal, so its lease
holds while it waits; a failed commit drops the group's results, stops renewing their ids and raises on
the engine's thread, so their leases expire and the reaper re-queues them; a crash loses only uncommitted
results, whose leases expire the same way.

No row stays leased to this worker without running: rows a claim leased are renewed with the rest until
the engine thread takes them (the runner takes them before each call returns), a hand-back waits for a
claim on its way and releases its rows (`take_unstarted`), `close` releases rows no one took, and a row
re-queued under the runner that its own claimer leased back is still the runner's, not lost.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.orm import Session

from storage.db import transaction
from storage.metrics.events import count_decode_tokens
from storage.queue.backlog import done_batches
from storage.queue.checkpoints import Generated, restart, save_checkpoints, save_handed_back, still_open
from storage.queue.claim import ClaimedRequest, claim
from storage.queue.handback import paused_of
from storage.queue.leases import Outcome, record_outcomes, release, renew, take_back
from storage.settings import Settings
from worker.engine import EngineResult

log = logging.getLogger(__name__)

MAX_PENDING = 16  # writes (flushes and renewals) queued before `submit` makes the engine thread wait
MAX_COALESCED = 8  # queued flushes the writer commits in one transaction when the database falls behind


@dataclass
class Claimed:
    """One claim's rows and how many were asked for (fewer: the queue ran dry)."""

    rows: list[ClaimedRequest]
    asked: int


@dataclass
class _Checkpoints:
    """Token ids to store (periodic; rows the reaper took back; with paused rows `released`), or drop (`restarted`)."""

    generated: dict[str, Generated]
    handed_back: bool = False
    restarted: dict[str, str] = field(default_factory=dict)
    released: list[str] = field(default_factory=list)


_Renewal = tuple[list[str], dict[str, Generated]]  # leases to renew; checkpoints stored with them


@dataclass
class _Flush:
    run_id: str
    write_run: Callable[[Session], None]
    outcomes: list[Outcome]
    results: list[EngineResult]
    kept: dict[str, Generated]  # the results' tokens but the last, under their claims (`_keep_handed_back`)
    ids: frozenset[str] = field(init=False)

    def __post_init__(self) -> None:
        self.ids = frozenset(o.request_id for o in self.outcomes)


class QueueIO:
    """Two threads doing one runner's database work; the engine thread only hands over and collects."""

    def __init__(
        self,
        *,
        model: str,
        worker_id: str,
        settings: Settings,
        on_batch_done: Callable[[str], None] | None = None,
        on_claimed: Callable[[list[ClaimedRequest]], None] = lambda rows: None,
    ) -> None:
        self.model, self.worker_id, self.settings = model, worker_id, settings
        self.lease_seconds, self.on_batch_done, self.on_claimed = settings.lease_seconds, on_batch_done, on_claimed
        self._writes: queue.Queue[_Flush | _Checkpoints | _Renewal | None] = queue.Queue(maxsize=MAX_PENDING)
        self._claims: queue.Queue[tuple[int, frozenset[str]] | None] = queue.Queue(maxsize=1)
        self._lock = threading.Lock()
        self._uncommitted: dict[int, frozenset[str]] = {}  # id(flush) -> its request ids, until committed
        self._claimed: deque[Claimed] = deque()
        self._claiming = False
        self._committed: deque[list[EngineResult]] = deque()
        self._lost: set[str] = set()
        self._paused: set[str] = set()
        self._errors: deque[BaseException] = deque()
        self._closed = False
        self._threads = [
            threading.Thread(target=self._write_loop, name=f"queue-writer-{model}", daemon=True),
            threading.Thread(target=self._claim_loop, name=f"queue-claimer-{model}", daemon=True),
        ]
        for thread in self._threads:
            thread.start()

    # --- the engine thread's side -------------------------------------------------------------------

    def submit(
        self,
        *,
        run_id: str,
        write_run: Callable[[Session], None],
        outcomes: list[Outcome],
        results: list[EngineResult],
        kept: dict[str, Generated] | None = None,
    ) -> None:
        """Queue one flush for commit (blocks while MAX_PENDING writes wait); raise an earlier failure.

        `write_run(session)` writes the engine run's counters as they were at hand-over (a snapshot); `kept`:
        the results' tokens, stored as checkpoints of rows a pause handed back before the results were.
        """
        self._check_open()
        self.raise_failure()
        flush = _Flush(run_id, write_run, outcomes, results, kept or {})
        with self._lock:
            self._uncommitted[id(flush)] = flush.ids
        self._writes.put(flush)

    def renew(self, request_ids: list[str], checkpoints: dict[str, Generated] | None = None) -> None:
        """Queue a renewal of these leases (and those of every result not yet committed), storing `checkpoints`
        (periodic ones) in the same write of their rows (storage/queue/leases.py `renew`)."""
        self._check_open()
        self._writes.put((list(request_ids), dict(checkpoints or {})))

    def checkpoint(self, generated: dict[str, Generated], *, handed_back: bool = False) -> None:
        """Queue a checkpoint write; `handed_back`: of rows a pause took back (storage/queue/checkpoints.py)."""
        self._check_open()
        if generated:
            self._writes.put(_Checkpoints(generated, handed_back))

    def release_paused(self, request_ids: list[str], generated: dict[str, Generated]) -> None:
        """Queue handing back rows of paused batches (aborted in the engine) with their tokens (`take_paused`)."""
        self._writes.put(_Checkpoints(generated, handed_back=True, released=request_ids))

    def restart(self, claims: dict[str, str]) -> None:
        """Queue dropping these rows' checkpoints (id -> its claim): the engine restarted their generation."""
        self._check_open()
        if claims:
            self._writes.put(_Checkpoints({}, restarted=claims))

    def request_claim(self, limit: int, *, held: frozenset[str] = frozenset()) -> None:
        """Ask the claimer for up to `limit` rows, unless a claim is already on its way; a row in `held` (still in
        this worker's engine) that comes back is a re-lease, its attempt given back (storage/queue/claim.py)."""
        self._check_open()
        with self._lock:
            if self._claiming or self._claimed or limit <= 0:
                return
            self._claiming = True
        self._claims.put((limit, held))

    def claiming(self) -> bool:
        """True while a claim is outstanding or rows it leased wait to be collected."""
        with self._lock:
            return self._claiming or any(claimed.rows for claimed in self._claimed)

    def take_claimed(self) -> Claimed | None:
        """The rows of a finished claim, if one finished since the last call."""
        with self._lock:
            return self._claimed.popleft() if self._claimed else None

    def take_unstarted(self) -> list[ClaimedRequest]:
        """Wait for a claim on its way; then the rows of every claim not yet taken (a hand-back releases them)."""
        self._claims.join()
        return self._pop_claimed()

    def uncommitted(self) -> set[str]:
        """Ids whose results were handed over and are not committed yet (nor dropped by a failed commit)."""
        with self._lock:
            return set().union(*self._uncommitted.values())

    def take_committed(self) -> list[list[EngineResult]]:
        """The results of every flush committed since the last call (for the metrics probe)."""
        with self._lock:
            done, self._committed = list(self._committed), deque()
        return done

    def take_lost(self) -> set[str]:
        """Ids whose lease a renewal found gone since the last call (cancelled, expired, re-queued)."""
        with self._lock:
            lost, self._lost = self._lost, set()
        return lost

    def take_paused(self) -> set[str]:
        """Ids a renewal found in a paused batch since the last call: to hand back (storage/queue/handback.py)."""
        with self._lock:
            paused, self._paused = self._paused, set()
        return paused

    def raise_failure(self) -> None:
        """Re-raise, on the engine thread, the first database error the threads met since the last call."""
        with self._lock:
            error = self._errors.popleft() if self._errors else None
        if error is not None:
            raise error

    def drain(self) -> None:
        """Wait until every handed-over write and claim is done; then raise any failure they met."""
        self._writes.join()
        self._claims.join()
        self.raise_failure()

    @property
    def closed(self) -> bool:
        """True once `close` was called."""
        return self._closed

    def close(self) -> None:
        """Finish what was handed over, release claimed rows no one took, stop both threads (once; later
        hand-overs raise)."""
        if self._closed:
            return
        self._closed = True
        self._writes.put(None)
        self._claims.put(None)
        for thread in self._threads:
            thread.join(timeout=30)

    def _pop_claimed(self) -> list[ClaimedRequest]:
        with self._lock:
            rows = [row for claimed in self._claimed for row in claimed.rows]
            self._claimed.clear()
        return rows

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError(f"the runner I/O threads of {self.model} are closed (after a hand-back)")

    # --- the threads ----------------------------------------------------------------------------------

    def _write_loop(self) -> None:
        while (item := self._writes.get()) is not None:
            items: list[_Flush | _Checkpoints | _Renewal | None] = [item]
            while isinstance(items[-1], _Flush) and len(items) < MAX_COALESCED:
                try:  # flushes queued behind this one share its transaction (the database fell behind)
                    items.append(self._writes.get_nowait())
                except queue.Empty:
                    break
            flushes = [flush for flush in items if isinstance(flush, _Flush)]
            if flushes:
                self._guarded(self._commit, flushes)
                with self._lock:
                    for flush in flushes:  # committed, or dropped: no longer renewed
                        self._uncommitted.pop(id(flush), None)
            for other in items[len(flushes) :]:  # at most one, at the end: a renewal or the stop mark
                if other is None:
                    break
                self._guarded(self._checkpoint if isinstance(other, _Checkpoints) else self._renew, other)
            for _ in items:
                self._writes.task_done()
            if items[-1] is None:
                return
        self._writes.task_done()

    def _guarded(self, work: Callable[[Any], None], arg: Any) -> None:
        try:
            work(arg)
        except Exception as error:  # surfaced on the engine thread; this thread keeps serving
            log.exception("runner database write failed")
            with self._lock:
                self._errors.append(error)

    def _commit(self, flushes: list[_Flush]) -> None:
        """One transaction: each run's latest counters, then every result under the lease check."""
        latest = {flush.run_id: flush.write_run for flush in flushes}  # counters are cumulative: last wins
        touched, stored = set[str](), set[str]()
        with transaction() as session:
            for write_run in latest.values():
                write_run(session)
            for run_id in latest:
                outcomes = [o for flush in flushes if flush.run_id == run_id for o in flush.outcomes]
                recorded = record_outcomes(session, worker_id=self.worker_id, run_id=run_id, outcomes=outcomes)
                touched, stored = touched | set(recorded.batches), stored | recorded.stored
            done = done_batches(session, batch_ids=sorted(touched))
            self._keep_handed_back(session, {r: g for f in flushes for r, g in f.kept.items() if r not in stored})
        with self._lock:
            self._committed.extend(flush.results for flush in flushes)
        for batch_id in done:
            if self.on_batch_done is not None:
                self.on_batch_done(batch_id)

    @staticmethod
    def _keep_handed_back(session: Session, kept: dict[str, Generated]) -> None:
        """Results a pause took back before they were stored (`kept`: those `record` did not store): their tokens but
        the last go with the queued row as its checkpoint, so the next run decodes only that one again (an end of
        sequence or a stop, never past it) instead of the whole generation."""
        if kept and (rerun := still_open(session, request_ids=sorted(kept))):
            save_handed_back(session, checkpoints={rid: kept[rid] for rid in rerun})

    def _renew(self, renewal: _Renewal) -> None:
        request_ids, due = renewal
        with self._lock:  # results waiting for their commit, rows waiting for the engine: held all the same
            waiting = set().union(*self._uncommitted.values()) if self._uncommitted else set()
            waiting |= {row.id for claimed in self._claimed for row in claimed.rows}
        held = sorted(set(request_ids) | waiting)
        if not held:
            return
        lease = self.lease_seconds
        with transaction() as session:
            lost = renew(session, worker_id=self.worker_id, request_ids=held, lease_seconds=lease, checkpoints=due)
            if lost:  # re-queued under us while we still run them: ours again, the same try (docs/workers.md)
                back = take_back(session, worker_id=self.worker_id, request_ids=sorted(lost), lease_seconds=lease)
                if due_back := {rid: due[rid] for rid in back & set(due)}:  # the renewal's guard missed them
                    save_checkpoints(session, worker_id=self.worker_id, checkpoints=due_back)
                lost -= back
            if lost:  # our own claimer may have leased them back meanwhile (a re-lease, see `request_claim`):
                # still ours; reported lost, the runner would abort them and leave them leased to it unrun
                lost = renew(session, worker_id=self.worker_id, request_ids=sorted(lost), lease_seconds=lease)
            paused = paused_of(session, worker_id=self.worker_id, request_ids=sorted(set(held) - lost))
        with self._lock:
            self._lost |= lost - waiting  # not in the engine (yet, or any more): nothing to abort
            self._paused |= paused - waiting  # results: `record` hands them back; claimed rows: the next renewal

    def _checkpoint(self, item: _Checkpoints) -> None:
        with transaction() as session:
            if item.restarted:
                restart(session, claims=item.restarted)
                return
            if not item.handed_back:
                save_checkpoints(session, worker_id=self.worker_id, checkpoints=item.generated)
                return
            if item.released:  # of paused batches: back to the queue with their tokens, in one transaction
                release(session, worker_id=self.worker_id, request_ids=item.released, checkpoints=item.generated)
            stored = save_handed_back(session, checkpoints=item.generated)  # rows the reaper re-queued too
            rerun = still_open(session, request_ids=sorted(set(item.generated) - stored))  # claimed meanwhile
        count_decode_tokens(self.model, discarded=sum(len(item.generated[rid].token_ids) for rid in rerun))

    def _claim_loop(self) -> None:
        while (asked := self._claims.get()) is not None:
            limit, held = asked
            rows: list[ClaimedRequest] = []
            try:
                with transaction() as session:
                    rows = claim(
                        session,
                        model=self.model,
                        worker_id=self.worker_id,
                        limit=limit,
                        lease_seconds=self.lease_seconds,
                        settings=self.settings,
                        held=held,
                    )
                self.on_claimed(rows)  # before the engine thread takes them: its engine renders them ahead
            except Exception as error:
                log.exception("runner claim failed")
                with self._lock:
                    self._errors.append(error)
            finally:
                with self._lock:
                    self._claimed.append(Claimed(rows, limit))
                    self._claiming = False
                self._claims.task_done()
        self._release_untaken()
        self._claims.task_done()

    def _release_untaken(self) -> None:
        """Closing: rows a claim leased that the engine thread never took go back to the queue unrun."""
        ids = [row.id for row in self._pop_claimed()]
        if not ids:
            return
        try:
            with transaction() as session:
                released = release(session, worker_id=self.worker_id, request_ids=ids)
            log.info("released %d claimed requests the runner of %s never started", released, self.model)
        except Exception:  # the database is away: their leases expire and the reaper re-queues them
            log.exception("could not release %d claimed requests of %s", len(ids), self.model)
