"""The runner: keeps one warm engine continuously fed from the Postgres queue.

Claim (short transaction) → submit to the engine → step → record finished results (short transaction).
No transaction is open while the engine steps, and the steady database work is off the engine's thread:
claims, result commits and lease renewals run on the runner's I/O threads (worker/feed/queue_io.py). Each
call (`run_for`, `hand_back`) returns with every row this worker leased either in the engine or released:
results committed, a claim still on its way waited for and its rows taken in. In-flight work stays in the
engine between calls of `run_for`, so a Celery task boundary never drains the running batch; its leases
are renewed meanwhile by the worker's heartbeat thread (`renew_idle`, worker/process/liveness.py), and
reconciled before every claim (docs/workers.md).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import socket
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable

from sqlalchemy.orm import Session

from storage.clock import now_f
from storage.db import transaction
from storage.finance.engine_runs import RunCounters, save_run
from storage.ids import new_id
from storage.queue.backlog import has_queued
from storage.queue.checkpoints import save_handed_back
from storage.queue.claim import ClaimedRequest
from storage.queue.leases import release
from storage.settings import Settings
from worker.engine import Engine, EngineResult
from worker.feed.checkpointing import Checkpoints
from worker.feed.probe import RunnerProbe
from worker.feed.queue_io import QueueIO
from worker.feed.rows import engine_request, outcome_of, rendering_ahead

log = logging.getLogger(__name__)

FLUSH_SECONDS = 1.0  # 0.5 s: twice the results transactions, 0.06 CPU-s more per 1,000 requests (bench/runner_io.py)
FLUSH_RESULTS = 256
RUN_WRITE_SECONDS = 2.0  # counters alone (no result to store) are written this often, or by a forced flush
RENEW_SECONDS = 2.0
IDLE_CLAIM_SECONDS = 0.5
SAMPLE_SECONDS = 0.25


def make_worker_id() -> str:
    """A worker identity unique per process start (host, pid, random suffix)."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class Runner:
    """Feeds one engine from the queue for one model; holds in-flight work across `run_for` calls."""

    def __init__(
        self,
        engine: Engine,
        *,
        model: str,
        settings: Settings,
        worker_id: str | None = None,
        on_batch_done: Callable[[str], None] | None = None,
    ) -> None:
        self.engine = engine
        self.on_batch_done = on_batch_done
        self.model = model
        self.settings = settings
        self.worker_id = worker_id or make_worker_id()
        self.max_inflight = engine.max_num_seqs * settings.inflight_per_seq
        self.refill_below = self.max_inflight - max(1, engine.max_num_seqs // 2)
        self.inflight: set[str] = set()
        self.urgent: set[str] = set()  # in-flight requests claimed inside their deadline's urgency horizon
        self.capped: set[str] = set()  # in flight, of a capped batch or budgeted tenant: flushed as they finish
        self.pending: list[EngineResult] = []
        self.committing: set[str] = set()  # results with the writer thread: the probe still times them
        self.counters = RunCounters()  # this engine run's, written to its EngineRun row with every flush
        self.probe = RunnerProbe(model)  # what it reports to Prometheus
        self.samples: deque[tuple[float, int, int]] = deque(maxlen=14_400)  # (time, running, queued)
        self.run_id = new_id("run_")
        self._run_started = now_f()
        self._run_written = False
        self._last_flush = time.monotonic()
        self._last_run_write = time.monotonic()
        self._last_renew = time.monotonic()
        self._last_empty_claim = 0.0
        self._last_sample = 0.0
        self._lock = threading.Lock()
        self._dirty = False
        self._queue_backlog = False
        self.checkpoints = Checkpoints(engine, model=model, settings=settings)  # worker/feed/checkpointing.py
        # Claims (rows rendered ahead), commits and lease renewals on threads of their own; `close_io` stops them.
        ahead = rendering_ahead(engine)
        self.io = QueueIO(
            model=model, worker_id=self.worker_id, settings=settings, on_batch_done=on_batch_done, on_claimed=ahead
        )

    @property
    def models(self) -> list[str]:
        """A runner serves exactly one model."""
        return [self.model]

    def warm(self) -> None:
        """Nothing to do: a runner is built around an engine that is already loaded."""

    def serve_for(self, seconds: float, *, stop: threading.Event | None = None) -> bool:
        """The `Feeder` name for `run_for`."""
        return self.run_for(seconds, stop=stop)

    def run_for(self, seconds: float, *, stop: threading.Event | None = None) -> bool:
        """Feed and step the engine for up to `seconds`; return False once there is nothing to do."""
        with self._lock:
            until = time.monotonic() + seconds
            self._flush(force=True)  # results a failed flush kept, before their leases are checked
            self._reconcile()  # before claiming: rows re-queued under us are ours again, not new work
            while time.monotonic() < until and not (stop and stop.is_set()):
                self._top_up()
                if self.engine.has_unfinished():
                    self._step()
                elif not self.inflight:
                    self._flush(force=True)  # waits for the writer and for a claim on its way
                    if self._admit_arrived():
                        continue
                    if not self._queue_has_work():
                        self._close_run()
                        return False
                    time.sleep(0.05)
                self._flush(force=False)
                self._renew_if_due()
            self._settle()
            if now_f() - self._run_started > self.settings.engine_run_max_seconds:
                self._close_run()
            return True

    def renew_idle(self) -> bool:
        """Between tasks: store kept results and renew held leases, unless `run_for` is on it; True if done here."""
        if self.io.closed:
            return True  # handed back and closed (a switch, a registry change): nothing is held any more
        if not self._lock.acquire(blocking=False):
            return False  # run_for (or hand_back) holds the engine and renews as it goes
        try:
            self._flush(force=True)
            self._reconcile()
            return True
        finally:
            self._lock.release()

    def held(self) -> list[str]:
        """Requests this runner answers for: in the engine, or finished with the result not yet stored."""
        return sorted(self.inflight | {result.request_id for result in self.pending})

    def hand_back(self, *, drain_seconds: float) -> int:
        """Stop claiming, let in-flight work finish for up to `drain_seconds`, re-queue the rest; return how many."""
        with self._lock:
            until = time.monotonic() + drain_seconds
            while self.engine.has_unfinished() and time.monotonic() < until:
                self._step()
                self._flush(force=False)
                self._renew_if_due()
            self._flush_before_hand_back()
            left = sorted(self.inflight)
            checkpoints = self.checkpoints.of(left)  # before the abort forgets them
            self.engine.abort(left)
            self.urgent.clear()
            self.inflight.clear()
            left += [row.id for row in self.io.take_unstarted()]  # leased by a claim, never in the engine
            try:
                with transaction() as session:  # the tokens go back with the rows, in one transaction
                    released = release(session, worker_id=self.worker_id, request_ids=left, checkpoints=checkpoints)
                    save_handed_back(session, checkpoints=checkpoints)  # rows the reaper re-queued unnoticed
            finally:
                self.checkpoints.forget_all()
                self._close_run()
            self.io.drain()  # checkpoint writes queued before the hand-back are done too
            return released

    def _flush_before_hand_back(self) -> None:
        """Store finished results first (rows a pause took back store their tokens on their own); a failure
        is logged, not raised: the in-flight rows go back all the same, the failed group's leases expire."""
        for _ in range(2):  # the second hands over what the first kept when an earlier write had failed
            try:
                self._flush(force=True)
                return
            except Exception:
                log.exception("storing results before a hand-back of %s failed", self.model)

    def _close_run(self) -> None:
        """The engine went idle: the next work starts a new EngineRun (a stretch of busy time)."""
        if self._run_written:
            self.run_id = new_id("run_")
            self._run_started = now_f()
            self._run_written = False
            self.counters = RunCounters()

    def _top_up(self) -> None:
        if (limit := self.engine.dispatch_limit()) is not None:
            self.max_inflight = self.refill_below = limit  # shared mode: the engine's budget decides
        self._admit_arrived()
        if len(self.inflight) >= self.refill_below:
            return
        idle = not self.engine.has_unfinished()
        if not idle and time.monotonic() - self._last_empty_claim < IDLE_CLAIM_SECONDS:
            return  # the queue was empty a moment ago; don't poll it on every step
        want = self.max_inflight - len(self.inflight)
        # On the claimer thread: rows arrive later. A result on its way to the database is held too: a pause and a
        # resume in between must not let the claim start its request again (the commit stores it under the lease).
        self.io.request_claim(want, held=frozenset(self.held()) | self.io.uncommitted())

    def _admit_arrived(self) -> bool:
        """Hand the rows of a claim that finished to the engine; True if it brought any."""
        if (arrived := self.io.take_claimed()) is None:
            return False
        self._admit(arrived.rows, asked=arrived.asked)
        return bool(arrived.rows)

    def _settle(self) -> None:
        """End of a call: results committed, and the rows of a claim that landed meanwhile in the engine.

        Left waiting for the next call, they would be leased to this worker without running.
        """
        self._flush(force=True)  # waits for the writer and for a claim still on its way
        if self._admit_arrived():
            self._flush(force=True)  # the engine may have refused some at once: their error lines

    def _admit(self, claimed: list[ClaimedRequest], *, asked: int) -> None:
        """Hand claimed rows to the engine; fewer than `asked` means the queue ran dry for now."""
        want, held = asked, set(self.held()) | self.io.uncommitted()
        self.probe.claimed(claimed)
        self._queue_backlog = len(claimed) == want
        if len(claimed) < want:
            self._last_empty_claim = time.monotonic()
        restarted: dict[str, str] = {}
        for item in claimed:
            if item.id in held:  # re-queued under us and claimed back: a re-lease of work already in the engine,
                if not self.checkpoints.relet(item.id, claim_id=item.claim_id, stored=item.checkpoint):
                    restarted[item.id] = item.claim_id  # which runs under the new claim from now on
                continue
            rejected = self.engine.add(engine_request(item))
            if rejected is not None:
                self.pending.append(rejected)
            else:
                self.inflight.add(item.id)
                if item.urgent:
                    self.urgent.add(item.id)
                if item.capped:
                    self.capped.add(item.id)
                if not self.checkpoints.admitted(item.id, claim_id=item.claim_id, stored=len(item.checkpoint)):
                    restarted[item.id] = item.claim_id
        self.io.restart(restarted)  # queued before any write of their new tokens
        self._signal_urgency()

    def _signal_urgency(self) -> None:
        """Tell an engine that can lend capacity (shared mode) whether work near its deadline is in flight."""
        self.urgent &= self.inflight
        self.engine.set_urgent(bool(self.urgent))

    def _step(self) -> None:
        started = time.perf_counter()
        results = self.engine.step()
        self.counters.busy_seconds += time.perf_counter() - started
        self._dirty = True
        stats = self.engine.stats()
        now = time.monotonic()
        keep = now - self._last_sample >= SAMPLE_SECONDS
        if keep:
            self._last_sample = now
        # Work counts as queued if the engine has waiting sequences or the last claim found more rows than
        # it could take: a runner that let its engine drain while rows waited would show up here.
        queued = stats.waiting + (1 if self._queue_backlog else 0)
        # Sequences that ran in this step: those still running plus those that finished in it (the engine
        # reports counts after the step, when finishers have already left and waiters not yet joined).
        running = min(self.engine.max_num_seqs, stats.running + len(results))
        self.counters.observe_step(running, queued)
        if keep:
            self.samples.append((time.time(), running, queued))
        for result in results:
            self.inflight.discard(result.request_id)
            self.checkpoints.finished(result)
        if self.urgent and not self.urgent & self.inflight:
            self._signal_urgency()  # the last urgent request finished: give lent capacity back
        self.pending.extend(results)

    def _flush(self, *, force: bool) -> None:
        self._collect_io(wait=force)
        due = time.monotonic() - self._last_flush >= FLUSH_SECONDS or len(self.pending) >= FLUSH_RESULTS
        due = due or (bool(self.capped) and any(r.request_id in self.capped for r in self.pending))  # caps: at once
        if not (force or due):
            return
        self._last_flush = time.monotonic()
        stale = force or time.monotonic() - self._last_run_write >= RUN_WRITE_SECONDS
        if not self.pending and not (self._dirty and stale):
            return
        self._dirty = False
        results = list(self.pending)
        added = {
            "prompt_tokens": sum(result.prompt_tokens for result in results),
            "completion_tokens": sum(result.completion_tokens for result in results),
            "finished": len(results),
        }
        self.counters.add_results(**added)
        del self.pending[: len(results)]  # the writer thread commits them (worker/feed/queue_io.py)
        self.capped &= self.inflight
        self._hand_over(results, wait=force)

    def _probe_flushed(self, results: list[EngineResult]) -> None:
        self.probe.flushed(
            results,
            run_id=self.run_id,
            counters=self.counters,
            inflight=set(self.held()) | self.committing,  # in the engine, finished and not yet committed
            stats=self.engine.stats(),
            slots=self.engine.max_num_seqs,
        )

    def _run_writer(self) -> Callable[[Session], None]:
        """Writes the run's counters as they are now (a snapshot: the writer thread may run it later)."""
        # A row written before may be gone (a fresh database under a warm runner): save_run inserts it again.
        return functools.partial(
            save_run,
            run_id=self.run_id,
            worker_id=self.worker_id,
            model=self.model,
            started_at=self._run_started,
            max_num_seqs=self.engine.max_num_seqs,
            counters=dataclasses.replace(self.counters),
            ended_at=now_f(),
            exists=self._run_written,
        )

    def _renew_if_due(self) -> None:
        if time.monotonic() - self._last_renew >= RENEW_SECONDS:
            self._reconcile()
        elif self.settings.checkpoint_interval_seconds < RENEW_SECONDS and (due := self.checkpoints.due(self.inflight)):
            self.io.checkpoint(due)  # an interval shorter than the renewals'

    def _reconcile(self) -> None:
        """Renew every held lease; take back rows re-queued under us; abort what is gone (cancelled, re-leased)."""
        self._last_renew = time.monotonic()
        # On the writer thread, with rows a claim leased meanwhile; leases it finds lost come back via _collect_io.
        # Periodic checkpoints (the crash bound: docs/workers.md) go with it, in the renewal's own row versions.
        self.io.renew(self.held(), self.checkpoints.due(self.inflight))

    def _drop_lost(self, lost: set[str]) -> None:
        if lost:
            log.info("aborting %d requests no longer leased or paused (cancelled, expired, leased again)", len(lost))
            self.engine.abort(sorted(lost & self.inflight))
            self.inflight -= lost
            self.checkpoints.forget(lost)
            self.pending = [result for result in self.pending if result.request_id not in lost]
            self._signal_urgency()

    def _hand_over(self, results: list[EngineResult], *, wait: bool) -> None:
        """Give one flush to the writer thread; with `wait`, return once it (and all before it) committed."""
        outcomes = [outcome_of(result) for result in results]
        self.committing.update(result.request_id for result in results)
        kept = self.checkpoints.kept(results)  # the tokens of results a pause may hand back unstored
        self.io.submit(run_id=self.run_id, write_run=self._run_writer(), outcomes=outcomes, results=results, kept=kept)
        self._run_written, self._last_run_write = True, time.monotonic()
        if wait:
            self._collect_io(wait=True)

    def _collect_io(self, *, wait: bool) -> None:
        """What the I/O threads finished: committed results to the probe, lost leases aborted, errors raised."""
        if wait:
            self.io.drain()
        for results in self.io.take_committed():
            self.committing.difference_update(result.request_id for result in results)
            self._probe_flushed(results)
        lost = self.io.take_lost() & self.inflight
        if lost:  # the reaper re-queued these (of a paused batch): their tokens go with them while still unclaimed
            self.io.checkpoint(self.checkpoints.of(lost), handed_back=True)
        self._drop_lost(lost)
        if paused := self.io.take_paused() & self.inflight:  # their batch was paused: hand them back, tokens and all
            checkpoints = self.checkpoints.of(paused)
            self._drop_lost(paused)
            self.io.release_paused(sorted(paused), checkpoints)
        self.io.raise_failure()

    def close_io(self) -> None:
        """Stop the I/O threads once what was handed to them is done (tests, benchmarks, shutdown, a switch);
        rows a claim leased that never reached the engine go back to the queue (worker/feed/queue_io.py)."""
        self.io.close()

    def _queue_has_work(self) -> bool:
        if self.io.claiming():
            return True  # a claim is on its way or its rows wait to be handed to the engine
        with transaction() as session:
            return has_queued(session, model=self.model)

    def slot_occupancy(self) -> float | None:
        """Mean share of engine slots in use over the steps where work was waiting."""
        occ = self.counters
        if not occ.queued_steps:
            return None
        return occ.queued_running_seq_steps / (occ.queued_steps * self.engine.max_num_seqs)
