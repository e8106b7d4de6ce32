"""The runner's database work off the engine's thread: claims ahead, result commits, lease renewals, hand-backs.

On an 8x H100 node a decode step of a 70B model takes 4-22 ms; a claim or a results transaction on the
engine's thread (tens of ms on a loaded database) would leave the GPU idle for that long (bench/gpu_timed.py).
The runner hands that work to two threads of its own (its only path: there is no inline one):

* the writer does the writes in the order handed over, one message type per kind (worker/feed/writes.py:
  results, renewals, checkpoints, hand-backs), from a bounded queue: when the database falls behind, a hand-over
  blocks and the engine waits; nothing piles up without limit;
* the claimer leases the next rows while the engine steps, at most one `ClaimAsk` outstanding, and has the engine
  render them ahead (`on_claimed`: `Engine.prepare`, worker/engine/vllm_ahead.py).

Exactly-once is the database's lease check: a result counts only once its transaction commits (`record`
stores it only while this worker holds the lease). Its lease is renewed until its flush is handed over, and the
writer works in order, so no renewal comes between the hand-over and the commit. Each flush is reported back
(`take_written`), committed or dropped: a failed commit drops the group's results and raises on the engine's
thread; their leases expire and the reaper re-queues them. A crash loses only uncommitted results, whose leases
expire the same way.

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
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

from sqlalchemy.orm import Session

from storage.db import transaction
from storage.queue.checkpoints import Generated
from storage.queue.claim import ClaimedRequest, claim
from storage.queue.draws import Draws
from storage.queue.leases import release
from storage.queue.results import Outcome
from storage.settings import Settings
from worker.engine import EngineResult
from worker.feed import writes
from worker.feed.writes import Checkpoint, Flush, HandBack, Renewal, Restart, Write, Written

log = logging.getLogger(__name__)

MAX_PENDING = 16  # writes queued before a hand-over makes the engine thread wait
MAX_COALESCED = 8  # queued flushes the writer commits in one transaction when the database falls behind


@dataclass(frozen=True)
class ClaimAsk:
    """Lease up to `limit` rows; one in `held` (still this worker's) that comes back is a re-lease."""

    limit: int
    held: frozenset[str]


@dataclass
class Claimed:
    """One claim's rows and how many were asked for (fewer: the queue ran dry)."""

    rows: list[ClaimedRequest]
    asked: int


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
        self._writes: queue.Queue[Write | None] = queue.Queue(maxsize=MAX_PENDING)
        self._claims: queue.Queue[ClaimAsk | None] = queue.Queue(maxsize=1)
        self._lock = threading.Lock()
        self._claimed: deque[Claimed] = deque()
        self._claiming = False
        self._written: deque[Written] = deque()
        self._lost: set[str] = set()
        self._paused: set[str] = set()
        self._overdue: set[str] = set()
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
        """Queue one flush for commit (blocks while MAX_PENDING writes wait); `take_written` reports it.

        `write_run(session)` writes the engine run's counters as they were at hand-over (a snapshot); `kept`:
        the results' tokens, stored as checkpoints of rows a pause handed back before the results were.
        """
        self._put(Flush(run_id, write_run, outcomes, results, kept or {}))

    def renew(self, request_ids: Collection[str], checkpoints: dict[str, Generated] | None = None) -> None:
        """Queue a renewal of these leases, storing `checkpoints` (periodic ones) in the same write of their rows
        (storage/queue/leases.py `renew`); leases it finds lost or paused come back by `take_lost`, `take_paused`."""
        self._put(Renewal(list(request_ids), dict(checkpoints or {})))

    def checkpoint(self, generated: dict[str, Generated]) -> None:
        """Queue a periodic checkpoint write (storage/queue/checkpoints.py)."""
        if generated:
            self._put(Checkpoint(generated))

    def restart(self, claims: dict[str, str], draws: dict[str, Draws] | None = None) -> None:
        """Queue dropping these rows' checkpoints (id -> its claim): the engine restarted their generation; `draws`:
        the failed draws so far of those among them drawn again (storage/queue/draws.py)."""
        if claims:
            self._put(Restart(claims, dict(draws or {})))

    def release(
        self,
        request_ids: list[str],
        generated: dict[str, Generated],
        draws: dict[str, tuple[str, Draws]] | None = None,
    ) -> None:
        """Queue handing back these rows (aborted in the engine: a pause) with their tokens; with no ids, only the
        tokens of rows the reaper re-queued under this worker (storage/queue/checkpoints.py `save`) or
        continued in the background, with their checked lines' draws (storage/queue/copy_tokens.py)."""
        if request_ids or generated or draws:
            self._put(HandBack(request_ids, generated, dict(draws or {})))

    def hand_back(self, request_ids: list[str], generated: dict[str, Generated]) -> int:
        """`release`, then wait until it and every write before it are done; return how many rows went back."""
        message = HandBack(request_ids, generated)
        if request_ids or generated:
            self._put(message)
        self.drain()
        return message.released

    def request_claim(self, limit: int, *, held: frozenset[str] = frozenset()) -> None:
        """Ask the claimer for up to `limit` rows, unless a claim is already on its way; a row in `held` (still
        this worker's) that comes back is a re-lease, its attempt given back (storage/queue/claim.py)."""
        self._check_open()
        with self._lock:
            if self._claiming or self._claimed or limit <= 0:
                return
            self._claiming = True
        self._claims.put(ClaimAsk(limit, held))

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

    def take_written(self) -> list[Written]:
        """Every flush the writer finished since the last call, in order: committed, or dropped by a failure."""
        with self._lock:
            done, self._written = list(self._written), deque()
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

    def take_overdue(self) -> set[str]:
        """Ids a renewal found in a batch whose window closed since the last call: to cut short (expiry.py)."""
        with self._lock:
            overdue, self._overdue = self._overdue, set()
        return overdue

    def raise_failure(self) -> None:
        """Re-raise, on the engine thread, the first database error the threads met since the last call."""
        with self._lock:
            error = self._errors.popleft() if self._errors else None
        if error is not None:
            raise error

    def wait(self) -> None:
        """Wait until every handed-over write and claim is done."""
        self._writes.join()
        self._claims.join()

    def drain(self) -> None:
        """Wait until every handed-over write and claim is done; then raise any failure they met."""
        self.wait()
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

    def _put(self, write: Write) -> None:
        self._check_open()
        self._writes.put(write)

    def _pop_claimed(self) -> list[ClaimedRequest]:
        with self._lock:
            rows = [row for claimed in self._claimed for row in claimed.rows]
            self._claimed.clear()
        return rows

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError(f"the runner I/O threads of {self.model} are closed (after a hand-back)")

    # --- the writer -----------------------------------------------------------------------------------

    def _write_loop(self) -> None:
        while True:
            items: list[Write | None] = [self._writes.get()]
            while isinstance(items[-1], Flush) and len(items) < MAX_COALESCED:
                try:  # flushes queued behind this one share its transaction (the database fell behind)
                    items.append(self._writes.get_nowait())
                except queue.Empty:
                    break
            flushes = [item for item in items if isinstance(item, Flush)]
            if flushes:
                self._record(flushes)
            if (last := items[-1]) is not None and not isinstance(last, Flush):  # at most one, at the end
                self._guarded(self._write, last)
            for _ in items:
                self._writes.task_done()
            if last is None:
                return

    def _write(self, write: Write) -> None:
        match write:
            case Renewal():
                self._renew(write)
            case Checkpoint():
                writes.store_checkpoints(write)
            case Restart():
                writes.drop_checkpoints(write)
            case HandBack():
                writes.hand_back(write, worker_id=self.worker_id, model=self.model)

    def _guarded(self, work: Callable[[Any], object], arg: Any) -> None:
        try:
            work(arg)
        except Exception as error:  # surfaced on the engine thread; this thread keeps serving
            self._failed(error)

    def _failed(self, error: Exception) -> None:
        log.exception("runner database write failed")
        with self._lock:
            self._errors.append(error)

    def _record(self, flushes: list[Flush]) -> None:
        """Commit the flushes and report them (committed or dropped); then tell who waits for batches now done."""
        done: list[str] = []
        try:
            done, committed = writes.commit(flushes, worker_id=self.worker_id), True
        except Exception as error:
            self._failed(error)
            committed = False
        with self._lock:
            self._written.extend(Written(flush.results, committed) for flush in flushes)
        if self.on_batch_done is not None:
            for batch_id in done:
                self._guarded(self.on_batch_done, batch_id)

    def _renew(self, renewal: Renewal) -> None:
        with self._lock:  # rows a claim leased that wait for the engine thread: held all the same
            waiting = {row.id for claimed in self._claimed for row in claimed.rows}
        if not (held := sorted(set(renewal.request_ids) | waiting)):
            return
        lease = self.lease_seconds
        lost, paused, overdue = writes.renew_leases(
            held, renewal.checkpoints, worker_id=self.worker_id, lease_seconds=lease
        )
        with self._lock:  # the runner acts on those in its engine (a result: `record` hands it back)
            self._lost |= lost - waiting  # not in the engine yet: nothing to abort
            self._paused |= paused - waiting  # claimed rows: the next renewal, once the engine has them
            self._overdue |= overdue - waiting

    # --- the claimer ----------------------------------------------------------------------------------

    def _claim_loop(self) -> None:
        while (asked := self._claims.get()) is not None:
            rows: list[ClaimedRequest] = []
            try:
                with transaction() as session:
                    rows = claim(
                        session,
                        model=self.model,
                        worker_id=self.worker_id,
                        limit=asked.limit,
                        lease_seconds=self.lease_seconds,
                        settings=self.settings,
                        held=asked.held,
                    )
                self.on_claimed(rows)  # before the engine thread takes them: its engine renders them ahead
            except Exception as error:
                log.exception("runner claim failed")
                with self._lock:
                    self._errors.append(error)
            finally:
                with self._lock:
                    self._claimed.append(Claimed(rows, asked.limit))
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
