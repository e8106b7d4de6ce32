"""The runner: keeps one warm engine continuously fed from the Postgres queue.

Claim (short transaction) → submit to the engine → step → record finished results (short transaction).
No transaction is open while the engine steps, and the steady database work is off the engine's thread: claims,
result commits, lease renewals and hand-backs run on the runner's I/O threads (worker/feed/queue_io.py). What
the runner holds, request by request, is its ledger's (worker/feed/ledger.py): claimed, in the engine,
finished, with the writer. Each call (`run_for`, `hand_back`) returns with every row this worker leased
either in the engine or released: results committed, a claim still on its way waited for and its rows taken
in. In-flight work stays in the engine between calls of `run_for`, so a Celery task boundary never drains the
running batch; its leases are renewed meanwhile by the worker's heartbeat thread (`renew_idle`,
worker/process/liveness.py), and reconciled before every claim (docs/workers.md).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable

from storage.db import transaction
from storage.metrics.events import count_expiry_cuts
from storage.queue.backlog import has_queued
from storage.queue.claim import ClaimedRequest
from storage.settings import Settings
from worker.engine import Engine
from worker.feed.checkpointing import Checkpoints
from worker.feed.engine_run import EngineRunTally
from worker.feed.ledger import Ledger, State
from worker.feed.probe import RunnerProbe
from worker.feed.queue_io import QueueIO
from worker.feed.redraws import Redraws
from worker.feed.rows import engine_request, outcome_of, rendering_ahead

log = logging.getLogger(__name__)

FLUSH_SECONDS = 1.0  # 0.5 s: twice the results transactions, 0.06 CPU-s more per 1,000 requests (bench/runner_io.py)
FLUSH_RESULTS = 256
RENEW_SECONDS = 2.0
IDLE_CLAIM_SECONDS = 0.5


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
        self.model = model
        self.settings = settings
        self.worker_id = worker_id or make_worker_id()
        self.max_inflight = engine.max_num_seqs * settings.inflight_per_seq
        self.refill_below = self.max_inflight - max(1, engine.max_num_seqs // 2)
        self.ledger = Ledger()  # every request this runner holds, by state
        self.checkpoints = Checkpoints(engine, model=model, settings=settings)  # their claims and stored tokens
        self.redraws = Redraws(engine)  # checked answers drawn again
        self.run = EngineRunTally(worker_id=self.worker_id, model=model, max_num_seqs=engine.max_num_seqs)
        self.probe = RunnerProbe(model)  # what it reports to Prometheus
        self.io = QueueIO(  # claims (rows rendered ahead) and every write; `close_io` stops its threads
            model=model,
            worker_id=self.worker_id,
            settings=settings,
            on_batch_done=on_batch_done,
            on_claimed=rendering_ahead(engine),
        )
        self._lock = threading.Lock()  # held by `run_for` and `hand_back`; the heartbeat renews only when it is free
        self._last_flush = self._last_renew = time.monotonic()
        self._last_empty_claim = 0.0
        self._queue_backlog = False  # the last claim found as many rows as it asked for

    @property
    def models(self) -> list[str]:
        """A runner serves exactly one model."""
        return [self.model]

    @property
    def inflight(self) -> frozenset[str]:
        """The requests in the engine now."""
        return self.ledger.running()

    def held(self) -> list[str]:
        """Every request this runner answers for: claimed, in the engine, or finished and not yet recorded."""
        return sorted(self.ledger.held())

    def warm(self) -> None:
        """Nothing to do: a runner is built around an engine that is already loaded."""

    def serve_for(self, seconds: float, *, stop: threading.Event | None = None) -> bool:
        """The `Feeder` name for `run_for`."""
        return self.run_for(seconds, stop=stop)

    def run_for(self, seconds: float, *, stop: threading.Event | None = None) -> bool:
        """Feed and step the engine for up to `seconds`; return False once there is nothing to do."""
        with self._lock:
            until = time.monotonic() + seconds
            # Rows may have been queued since the last call (the embedded loop ingests between calls): claim at once,
            # not IDLE_CLAIM_SECONDS after the last claim that found the queue short.
            self._last_empty_claim = 0.0
            self._flush(force=True)  # results a failed flush kept, before their leases are checked
            self._reconcile()  # before claiming: rows re-queued under us are ours again, not new work
            while time.monotonic() < until and not (stop and stop.is_set()):
                self._top_up()
                if self.engine.has_unfinished():
                    self._step()
                elif not self.ledger.count(State.RUNNING):
                    self._flush(force=True)  # waits for the writer and for a claim on its way
                    if self._admit_arrived():
                        continue
                    if not self._queue_has_work():
                        self.run.close()
                        return False
                    time.sleep(0.05)
                self._flush(force=False)
                self._renew_if_due()
            self._settle()
            if self.run.too_long(self.settings.engine_run_max_seconds):
                self.run.close()
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

    def hand_back(self, *, drain_seconds: float) -> int:
        """Stop claiming, let in-flight work finish for up to `drain_seconds`, re-queue the rest; return how many."""
        with self._lock:
            until = time.monotonic() + drain_seconds
            while self.engine.has_unfinished() and time.monotonic() < until:
                self._step()
                self._flush(force=False)
                self._renew_if_due()
            self._flush_before_hand_back()
            restarted: dict[str, str] = {}
            self._take_in(self.io.take_unstarted(), restarted)  # a claim's rows the engine never took in
            self.io.restart(restarted)
            running = sorted(self.ledger.running())
            checkpoints = self.redraws.tag(self.checkpoints.of(running))  # before the abort forgets them
            self.engine.abort(running)
            self.redraws.forget(running)
            try:  # on the writer thread, after every write handed over before it
                return self.io.hand_back(self.ledger.hand_back(), checkpoints)
            finally:
                self.checkpoints.forget_all()
                self.run.close()
                self._signal_urgency()

    def _flush_before_hand_back(self) -> None:
        """Store finished results first (rows a pause took back store their tokens on their own); a failure
        is logged, not raised: the in-flight rows go back all the same, the failed group's leases expire."""
        for _ in range(2):  # the second hands over what the first kept when an earlier write had failed
            try:
                self._flush(force=True)
                return
            except Exception:
                log.exception("storing results before a hand-back of %s failed", self.model)

    def close_io(self) -> None:
        """Stop the I/O threads once what was handed to them is done (tests, benchmarks, shutdown, a switch);
        rows a claim leased that never reached the engine go back to the queue (worker/feed/queue_io.py)."""
        self.io.close()

    # --- claiming -------------------------------------------------------------------------------------

    def _top_up(self) -> None:
        if (limit := self.engine.dispatch_limit()) is not None:
            self.max_inflight = self.refill_below = limit  # shared mode: the engine's budget decides
        self._admit_arrived()
        # Lines waiting for their images hold no engine slot: another tenant's lines fill it meanwhile (a slow image
        # server never stalls the engine), up to as many more in flight.
        running = self.ledger.count(State.RUNNING) - min(self.engine.waiting_for_inputs(), self.max_inflight)
        if running >= self.refill_below:
            return
        idle = not self.engine.has_unfinished()
        if not idle and time.monotonic() - self._last_empty_claim < IDLE_CLAIM_SECONDS:
            return  # the queue was empty a moment ago; don't poll it on every step
        # On the claimer thread: rows arrive later. A result on its way to the database is held too: a pause and a
        # resume in between must not let the claim start its request again (the commit stores it under the lease).
        self.io.request_claim(self.max_inflight - running, held=self.ledger.held())

    def _admit_arrived(self) -> bool:
        """Hand the rows of a claim that finished to the engine; True if it brought any."""
        self._collect_written()  # first: a result the writer is done with is no longer held, its row may be back
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
        self.probe.claimed(claimed)
        self._queue_backlog = len(claimed) == asked
        if len(claimed) < asked:
            self._last_empty_claim = time.monotonic()
        restarted: dict[str, str] = {}
        overdue: set[str] = set()
        for row in self._take_in(claimed, restarted):
            if (refused := self.engine.add(engine_request(row))) is not None:
                self.ledger.refuse(refused)
                continue
            self.ledger.admit(row.id)
            self.redraws.admitted(row)
            if not self.checkpoints.admitted(row.id, claim_id=row.claim_id, stored=len(row.checkpoint)):
                restarted[row.id] = row.claim_id
            if row.overdue:
                overdue.add(row.id)
        self.io.restart(restarted)  # queued before any write of their new tokens
        if overdue:  # claimed at expiry for their checkpoints: answered from them now, nothing decoded past it
            self._cut(overdue)
        self._signal_urgency()

    def _take_in(self, rows: list[ClaimedRequest], restarted: dict[str, str]) -> list[ClaimedRequest]:
        """A claim's rows into the ledger; return those to start. A row still held was re-queued under us and
        claimed back: a re-lease of work already here, which runs on under the new claim (a checkpoint of the
        row that this generation does not extend goes in `restarted`)."""
        fresh = []
        for row in rows:
            if not self.ledger.holds(row.id):
                self.ledger.claim(row)
                fresh.append(row)
                continue
            self.ledger.relet(row.id)
            if not self.checkpoints.relet(row.id, claim_id=row.claim_id, stored=row.checkpoint):
                restarted[row.id] = row.claim_id
        return fresh

    def _queue_has_work(self) -> bool:
        if self.io.claiming():
            return True  # a claim is on its way or its rows wait to be handed to the engine
        with transaction() as session:
            return has_queued(session, model=self.model)

    # --- the engine -----------------------------------------------------------------------------------

    def _step(self) -> None:
        started = time.perf_counter()
        results, redrawn = self.redraws.screen(self.engine.step())  # answers failing their checks: drawn again
        if redrawn:  # their failed draws go with the row: a hand-back before the result keeps them
            self.io.restart(self.checkpoints.restarted(redrawn), self.redraws.drawn(set(redrawn)))
        seconds, stats = time.perf_counter() - started, self.engine.stats()
        self.run.stepped(seconds, stats, finished=len(results), backlog=self._queue_backlog)
        urgent = self.ledger.urgent()
        self.ledger.finish(results)
        for result in results:
            self.checkpoints.finished(result)
        if urgent and not self.ledger.urgent():
            self._signal_urgency()  # the last urgent request finished: give lent capacity back

    def _signal_urgency(self) -> None:
        """Tell an engine that can lend capacity (shared mode) whether work near its deadline is in flight."""
        self.engine.set_urgent(self.ledger.urgent())

    def _let_go(self, request_ids: set[str]) -> None:
        """Requests the ledger no longer holds (lost, paused): out of the engine, their checkpoints forgotten."""
        self.engine.abort(sorted(request_ids))
        self.checkpoints.forget(request_ids)
        self.redraws.forget(request_ids)
        self._signal_urgency()

    # --- the I/O threads ------------------------------------------------------------------------------

    def _flush(self, *, force: bool) -> None:
        """Hand finished results (and the run's counters) to the writer when due; with `force`, wait for them."""
        self._collect_io(wait=force)
        finished = self.ledger.count(State.FINISHED)
        due = time.monotonic() - self._last_flush >= FLUSH_SECONDS or finished >= FLUSH_RESULTS
        if not (force or due or self.ledger.capped_finished()):  # capped: at once, where the cap is checked
            return
        self._last_flush = time.monotonic()
        if not finished and not self.run.unwritten(force=force):
            return
        results = self.ledger.hand_over()
        self.run.finished(results)
        kept = self.checkpoints.kept(results)  # the tokens of results a pause may hand back unstored
        outcomes = [outcome_of(result) for result in results]
        write_run = self.run.writer()
        self.io.submit(run_id=self.run.run_id, write_run=write_run, outcomes=outcomes, results=results, kept=kept)
        if force:
            self._collect_io(wait=True)

    def _renew_if_due(self) -> None:
        if time.monotonic() - self._last_renew >= RENEW_SECONDS:
            self._reconcile()
        elif self.settings.checkpoint_interval_seconds < RENEW_SECONDS:  # an interval shorter than the renewals'
            self.io.checkpoint(self.checkpoints.due(self.ledger.running()))

    def _reconcile(self) -> None:
        """Renew every held lease; take back rows re-queued under us; abort what is gone (cancelled, re-leased)."""
        self._last_renew = time.monotonic()
        # On the writer thread, with rows a claim leased meanwhile; leases it finds lost come back via _collect_io.
        # Periodic checkpoints (the crash bound: docs/workers.md) go with it, in the renewal's own row versions.
        self.io.renew(self.ledger.to_renew(), self.checkpoints.due(self.ledger.running()))

    def _collect_io(self, *, wait: bool) -> None:
        """What the I/O threads finished: results recorded, lost leases aborted, paused rows handed back; then
        raise a failure they met."""
        if wait:
            self.io.wait()
        self._collect_written()
        if lost := self.ledger.running_among(self.io.take_lost()):
            log.info("aborting %d requests no longer leased (cancelled, expired, leased again)", len(lost))
            self._release_lost(lost)
        if paused := self.ledger.running_among(self.io.take_paused()):  # their batch was paused: tokens and all
            checkpoints = self.checkpoints.of(paused)
            self.ledger.pause(paused)
            self._let_go(paused)
            self.io.release(sorted(paused), checkpoints)
        if overdue := self.ledger.running_among(self.io.take_overdue()):  # their window closed: cut short
            self._cut(overdue)
        self.io.raise_failure()

    def _release_lost(self, lost: set[str]) -> None:
        """Rows whose lease is gone leave the engine; their tokens go with rows the reaper re-queued (of a paused
        batch) while still unclaimed, and with the copies of rows continued in the background (with the failed draws
        of checked lines: storage/queue/copy_tokens.py), before this worker's next claim can lease those copies."""
        claims = self.checkpoints.claims
        drawn = {rid: (claims[rid], d) for rid, d in self.redraws.drawn(lost).items() if rid in claims}
        generated = self.redraws.tag(self.checkpoints.of(lost))
        self.io.release([], generated, drawn)
        self.ledger.lose(lost)
        self._let_go(lost)
        if generated or drawn:
            self.io.wait()  # rare (a cancel, a continuation): one write, so its own claim finds the copies' tokens

    def _cut(self, request_ids: set[str]) -> None:
        """Answer these from what they generated so far (flushed with the next results); those with nothing to
        show leave the engine and go back to the queue, where the reaper ends them `batch_expired` (expiry.py)."""
        answers = self.engine.cut(sorted(request_ids))
        self.redraws.cut(answers)  # a checked line keeps the draws it made
        self.ledger.finish(answers)
        for answer in answers:
            self.checkpoints.finished(answer)
        self.redraws.forget(request_ids)
        if unanswered := request_ids - {answer.request_id for answer in answers}:
            self.ledger.lose(unanswered)
            # Their checkpoints resume nothing now (the window closed): dropped, so no claim takes them to be cut again
            self.io.restart(self.checkpoints.restarted(unanswered))
            self.checkpoints.forget(unanswered)
            self.io.release(sorted(unanswered), {})
        count_expiry_cuts(self.model, answered=len(answers), unanswered=len(unanswered))
        log.info(
            "cut %d requests short at their batch's expiry (%d had nothing to show)", len(request_ids), len(unanswered)
        )

    def _collect_written(self) -> None:
        """Flushes the writer is done with leave the ledger; those committed go to the probe."""
        for written in self.io.take_written():
            self.ledger.recorded(result.request_id for result in written.results)
            if written.committed:
                self.probe.flushed(
                    written.results,
                    run_id=self.run.run_id,
                    counters=self.run.counters,
                    inflight=self.ledger.held(),  # in the engine, finished and not yet committed
                    stats=self.engine.stats(),
                    slots=self.engine.max_num_seqs,
                )
