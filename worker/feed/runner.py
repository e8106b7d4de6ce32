"""The runner: keeps one warm engine continuously fed from the Postgres queue.

Claim (short transaction) → submit to the engine → step → record finished results (short transaction).
No transaction is open while the engine steps. In-flight work stays in the engine between calls of
`run_for`, so a Celery task boundary never drains the running batch; its leases are renewed meanwhile by
the worker's heartbeat thread (`renew_idle`, worker/process/liveness.py), and reconciled before every claim
(docs/workers.md).
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
from storage.metrics.events import count_decode_tokens
from storage.queue.backlog import done_batches, has_queued
from storage.queue.checkpoints import save_checkpoints, unpack_tokens
from storage.queue.claim import ClaimedRequest, claim
from storage.queue.leases import Outcome, record, release, renew, take_back
from storage.settings import Settings
from worker.engine import Engine, EngineRequest, EngineResult, Progress
from worker.feed.probe import RunnerProbe
from worker.feed.queue_io import QueueIO

log = logging.getLogger(__name__)

FLUSH_SECONDS = 0.5
FLUSH_RESULTS = 256
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
        self.pending: list[EngineResult] = []
        self.counters = RunCounters()  # this engine run's, written to its EngineRun row with every flush
        self.probe = RunnerProbe(model)  # what it reports to Prometheus
        self.samples: deque[tuple[float, int, int]] = deque(maxlen=14_400)  # (time, running, queued)
        self.run_id = new_id("run_")
        self._run_started = now_f()
        self._run_written = False
        self._last_flush = time.monotonic()
        self._last_renew = time.monotonic()
        self._last_empty_claim = 0.0
        self._last_sample = 0.0
        self._lock = threading.Lock()
        self._dirty = False
        self._queue_backlog = False
        self._checkpointed: dict[str, int] = {}  # in-flight request -> tokens its stored checkpoint holds
        self._last_checkpoint = time.monotonic()
        self.io = (  # database I/O on threads of its own, off the engine's (worker/feed/queue_io.py)
            QueueIO(
                model=model,
                worker_id=self.worker_id,
                settings=settings,
                on_batch_done=on_batch_done,
            )
            if settings.runner_io_thread
            else None
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
                    self._flush(force=True)
                    if not self._queue_has_work():
                        self._close_run()
                        return False
                    time.sleep(0.05)
                self._flush(force=False)
                self._renew_if_due()
            self._flush(force=True)
            if now_f() - self._run_started > self.settings.engine_run_max_seconds:
                self._close_run()
            return True

    def renew_idle(self) -> bool:
        """Between tasks: store kept results and renew held leases, unless `run_for` is on it; True if done here."""
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
            self._flush(force=True)  # results first; rows a pause took back store their tokens on their own
            left = sorted(self.inflight)
            checkpoints = self._checkpoints(self.engine.progress(left))  # before the abort forgets them
            self.engine.abort(left)
            self.urgent.clear()
            left += self._take_unstarted()
            with transaction() as session:  # the tokens go back with the rows, in one transaction
                released = release(session, worker_id=self.worker_id, request_ids=left, checkpoints=checkpoints)
            if self.io is not None:
                self.io.drain()
            self.inflight.clear()
            self._checkpointed.clear()
            self._close_run()
            return released

    def _checkpoints(self, progress: dict[str, Progress]) -> dict[str, list[int]]:
        """The generated ids worth storing (exact resumes); tokens of requests that cannot resume are discarded."""
        discarded = sum(len(p.token_ids) for p in progress.values() if not p.exact)
        count_decode_tokens(self.model, discarded=discarded)
        return {rid: p.token_ids for rid, p in progress.items() if p.exact and p.token_ids}

    def _periodic_checkpoints(self) -> dict[str, list[int]]:
        """Every `checkpoint_interval_seconds`: requests grown by `checkpoint_every_tokens` since their last one."""
        every = self.settings.checkpoint_every_tokens
        if not every or time.monotonic() - self._last_checkpoint < self.settings.checkpoint_interval_seconds:
            return {}
        self._last_checkpoint = time.monotonic()
        due = {
            rid: p.token_ids
            for rid, p in self.engine.progress(self.inflight).items()
            if p.exact and len(p.token_ids) - self._checkpointed.get(rid, 0) >= every
        }
        self._checkpointed.update((rid, len(ids)) for rid, ids in due.items())
        return due

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
        if self.io is not None and (arrived := self.io.take_claimed()) is not None:
            self._admit(arrived.rows, asked=arrived.asked)
        if len(self.inflight) >= self.refill_below:
            return
        idle = not self.engine.has_unfinished()
        if not idle and time.monotonic() - self._last_empty_claim < IDLE_CLAIM_SECONDS:
            return  # the queue was empty a moment ago; don't poll it on every step
        want = self.max_inflight - len(self.inflight)
        if self.io is not None:  # claimed on the claimer thread; the rows arrive at a later top-up
            self.io.request_claim(want, held=frozenset(self.held()))
            return
        held = set(self.held())
        with transaction() as session:
            claimed = claim(
                session,
                model=self.model,
                worker_id=self.worker_id,
                limit=want,
                lease_seconds=self.settings.lease_seconds,
                settings=self.settings,
                held=held,
            )
        self._admit(claimed, asked=want)

    def _admit(self, claimed: list[ClaimedRequest], *, asked: int) -> None:
        """Hand claimed rows to the engine; fewer than `asked` means the queue ran dry for now."""
        want, held = asked, set(self.held())
        self.probe.claimed(claimed)
        self._queue_backlog = len(claimed) == want
        if len(claimed) < want:
            self._last_empty_claim = time.monotonic()
        for item in claimed:
            if item.id in held:
                continue  # re-queued under us and claimed back: a re-lease of work already in the engine
            earlier = tuple(unpack_tokens(item.checkpoint)) if item.checkpoint else ()
            request = EngineRequest(request_id=item.id, url=item.url, body=item.body, resume_token_ids=earlier)
            rejected = self.engine.add(request)
            if rejected is not None:
                self.pending.append(rejected)
            else:
                self.inflight.add(item.id)
                if item.urgent:
                    self.urgent.add(item.id)
                if earlier:
                    self._resumed(item.id, len(earlier))
        self._signal_urgency()

    def _resumed(self, request_id: str, stored: int) -> None:
        """Count what a claimed checkpoint saved: the engine continues from its tokens, or restarted the request."""
        kept = len(self.engine.progress([request_id]).get(request_id, Progress([], False)).token_ids)
        count_decode_tokens(self.model, resumed=kept, discarded=stored - kept)
        self._checkpointed[request_id] = stored

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
            self._checkpointed.pop(result.request_id, None)
        if self.urgent and not self.urgent & self.inflight:
            self._signal_urgency()  # the last urgent request finished: give lent capacity back
        self.pending.extend(results)

    def _flush(self, *, force: bool) -> None:
        if self.io is not None:
            self._collect_io(wait=force)
        due = time.monotonic() - self._last_flush >= FLUSH_SECONDS or len(self.pending) >= FLUSH_RESULTS
        if not (force or due):
            return
        self._last_flush = time.monotonic()
        if not self.pending and not self._dirty:
            return
        self._dirty = False
        results = list(self.pending)
        added = {
            "prompt_tokens": sum(result.prompt_tokens for result in results),
            "completion_tokens": sum(result.completion_tokens for result in results),
            "finished": len(results),
        }
        self.counters.add_results(**added)
        if self.io is not None:  # the writer thread commits it (worker/feed/queue_io.py); the engine steps on
            del self.pending[: len(results)]
            self._hand_over(results, wait=force)
            return
        try:
            with transaction() as session:
                self._write_run(session)
                touched = record(
                    session,
                    worker_id=self.worker_id,
                    run_id=self.run_id,
                    outcomes=[_outcome(result) for result in results],
                )
                done = done_batches(session, batch_ids=touched)
        except Exception:
            # Keep the results (and their leases, see `held`) for the next flush rather than lose them.
            self.counters.add_results(**{name: -value for name, value in added.items()})
            self._dirty = True
            raise
        del self.pending[: len(results)]
        self._probe_flushed(results)
        for batch_id in done:
            if self.on_batch_done is not None:
                self.on_batch_done(batch_id)

    def _probe_flushed(self, results: list[EngineResult]) -> None:
        engine = self.engine
        stats, slots = engine.stats(), engine.max_num_seqs
        self.probe.flushed(
            results, run_id=self.run_id, counters=self.counters, inflight=self.inflight, stats=stats, slots=slots
        )

    def _write_run(self, session: Session) -> None:
        self._run_writer()(session)
        self._run_written = True

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

    def _reconcile(self) -> None:
        """Renew every held lease; take back rows re-queued under us; abort what is gone (cancelled, re-leased)."""
        self._last_renew = time.monotonic()
        held = self.held()
        if not held:
            return
        if self.io is not None:  # renewed on the writer thread; leases it finds lost come back via _collect_io
            self.io.renew(held)
            if checkpoints := self._periodic_checkpoints():  # the crash bound: docs/workers.md
                self.io.checkpoint(checkpoints)
            return
        lease = self.settings.lease_seconds
        checkpoints = self._periodic_checkpoints()  # on this path too: the crash bound holds without the I/O thread
        with transaction() as session:
            lost = renew(session, worker_id=self.worker_id, request_ids=held, lease_seconds=lease)
            if lost:
                lost -= take_back(session, worker_id=self.worker_id, request_ids=sorted(lost), lease_seconds=lease)
            save_checkpoints(session, worker_id=self.worker_id, checkpoints=checkpoints)
        self._drop_lost(lost)

    def _drop_lost(self, lost: set[str]) -> None:
        if lost:
            log.info("aborting %d requests no longer leased (cancelled, expired or leased again)", len(lost))
            self.engine.abort(sorted(lost & self.inflight))
            self.inflight -= lost
            for rid in lost:
                self._checkpointed.pop(rid, None)
            self.pending = [result for result in self.pending if result.request_id not in lost]
            self._signal_urgency()

    def _hand_over(self, results: list[EngineResult], *, wait: bool) -> None:
        """Give one flush to the writer thread; with `wait`, return once it (and all before it) committed."""
        assert self.io is not None
        outcomes = [_outcome(result) for result in results]
        self.io.submit(run_id=self.run_id, write_run=self._run_writer(), outcomes=outcomes, results=results)
        self._run_written = True
        if wait:
            self._collect_io(wait=True)

    def _collect_io(self, *, wait: bool) -> None:
        """What the I/O threads finished: committed results to the probe, lost leases aborted, errors raised."""
        assert self.io is not None
        if wait:
            self.io.drain()
        for results in self.io.take_committed():
            self._probe_flushed(results)
        lost = self.io.take_lost() & self.inflight
        if lost:  # a pause took these back: their tokens go with the rows while no one else has claimed them
            self.io.checkpoint(self._checkpoints(self.engine.progress(lost)), handed_back=True)
        self._drop_lost(lost)
        self.io.raise_failure()

    def _take_unstarted(self) -> list[str]:
        """Rows a finished claim leased that never reached the engine (a hand-back releases them too)."""
        arrived = self.io.take_claimed() if self.io is not None else None
        return [row.id for row in arrived.rows] if arrived is not None else []

    def close_io(self) -> None:
        """Stop the I/O threads once what was handed to them is done (tests, benchmarks, shutdown)."""
        if self.io is not None:
            self.io.close()

    def _queue_has_work(self) -> bool:
        if self.io is not None and self.io.claiming():
            return True  # a claim is on its way or its rows wait to be handed to the engine
        with transaction() as session:
            return has_queued(session, model=self.model)

    def slot_occupancy(self) -> float | None:
        """Mean share of engine slots in use over the steps where work was waiting."""
        occ = self.counters
        if not occ.queued_steps:
            return None
        return occ.queued_running_seq_steps / (occ.queued_steps * self.engine.max_num_seqs)


def _outcome(result: EngineResult) -> Outcome:
    return Outcome(
        request_id=result.request_id,
        status_code=result.status_code,
        body=result.body,
        prompt_tokens=result.prompt_tokens,
        completion_tokens=result.completion_tokens,
        engine_seconds=result.engine_seconds,
        error_code=result.error_code,
        error_message=result.error_message,
        cached_tokens=result.cached_tokens,
    )
