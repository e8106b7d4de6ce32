"""What the runner reports to Prometheus: one probe per runner, fed from two lines in worker/feed/runner.py.

`claimed` sees each claim (leases, re-claims, claim times); `flushed` runs after each results transaction
and turns the runner's own counters (busy time, steps, occupancy, kept per engine run) into counter
increments, sets the engine gauges and observes each request's claim-to-commit latency. The probe only
reads the runner; nothing the runner decides depends on it.
"""

from __future__ import annotations

import functools
import threading
import time
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, ParamSpec, cast

from sqlalchemy.orm import Session

from storage.batches import lifecycle
from storage.batches.batches import get_batch
from storage.metrics import events
from storage.queue.claim import ClaimedRequest
from worker.engine import EngineResult

if TYPE_CHECKING:
    from worker.feed.runner import Runner


class RunnerProbe:
    """Turns one runner's state into metric increments (deltas since the last flush, per engine run)."""

    def __init__(self, model: str) -> None:
        self.model = model
        self._claimed_at: dict[str, float] = {}
        self._run_id = ""
        self._seen = (0.0, 0, 0, 0, 0)  # busy seconds, steps, running seq-steps, queued steps, queued seq-steps
        events.prepare_models([model])

    def claimed(self, items: list[ClaimedRequest]) -> None:
        """Requests were leased: count them (and those leased before) and note when."""
        if not items:
            return
        at = time.monotonic()
        for item in items:
            self._claimed_at[item.id] = at
        events.CLAIMED.labels(self.model).inc(len(items))
        again = sum(1 for item in items if item.attempts > 1)
        if again:
            events.RECLAIMED.labels(self.model).inc(again)

    def flushed(self, runner: Runner, results: list[EngineResult]) -> None:
        """Results were committed: tokens, outcomes, latency, and the engine's counters and gauges."""
        model, at = self.model, time.monotonic()
        for result in results:
            events.ENGINE_RESULTS.labels(model, "completed" if result.ok else "failed").inc()
            claimed = self._claimed_at.pop(result.request_id, None)
            if claimed is not None:
                events.RESULT_LATENCY.labels(model).observe(at - claimed)
        events.PROMPT_TOKENS.labels(model).inc(sum(r.prompt_tokens for r in results))
        events.OUTPUT_TOKENS.labels(model).inc(sum(r.completion_tokens for r in results))
        for request_id in [rid for rid in self._claimed_at if rid not in runner.inflight]:
            del self._claimed_at[request_id]  # aborted or lost: no result will come
        self._engine_counters(runner)
        stats = runner.engine.stats()
        events.ENGINE_RUNNING.labels(model).set(stats.running)
        events.ENGINE_WAITING.labels(model).set(stats.waiting)
        events.ENGINE_INFLIGHT.labels(model).set(len(runner.inflight))
        events.ENGINE_SLOTS.labels(model).set(runner.engine.max_num_seqs)

    def _engine_counters(self, runner: Runner) -> None:
        occ, tot = runner.occupancy, runner.totals
        now = (tot.busy_seconds, occ.steps, occ.running_seq_steps, occ.queued_steps, occ.queued_running_seq_steps)
        before = self._seen if runner.run_id == self._run_id else (0.0, 0, 0, 0, 0)
        self._run_id, self._seen = runner.run_id, now
        model = self.model
        for counter, value, old in zip(
            (
                events.ENGINE_BUSY_SECONDS,
                events.ENGINE_STEPS,
                events.ENGINE_SEQ_STEPS,
                events.ENGINE_QUEUED_STEPS,
                events.ENGINE_QUEUED_SEQ_STEPS,
            ),
            now,
            before,
            strict=True,
        ):
            if value > old:
                counter.labels(model).inc(value - old)


_probes: weakref.WeakKeyDictionary[Runner, RunnerProbe] = weakref.WeakKeyDictionary()
_lock = threading.Lock()


def probe(runner: Runner) -> RunnerProbe:
    """The runner's probe, made on first use."""
    with _lock:
        found = _probes.get(runner)
        if found is None:
            found = _probes[runner] = RunnerProbe(runner.model)
        return found


P = ParamSpec("P")


def observed_ingest(ingest: Callable[P, str]) -> Callable[P, str]:
    """Wrap `ingest_batch`: time each pass over a `validating` batch and count its lines and bad lines."""

    @functools.wraps(ingest)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> str:
        session, batch_id = cast(Session, args[0]), str(kwargs["batch_id"])
        # Read under the row lock ingest takes anyway: a concurrent duplicate pass waits here, then sees the
        # batch already ingested and counts nothing.
        before = get_batch(session, tenant_id=None, batch_id=batch_id, lock=True).status
        started = time.perf_counter()
        status = ingest(*args, **kwargs)
        if before == lifecycle.VALIDATING:
            batch = get_batch(session, tenant_id=None, batch_id=batch_id)
            events.observe_ingest(
                enqueued=batch.request_total,
                problems=batch.errors or [],
                status=status,
                seconds=time.perf_counter() - started,
            )
        return status

    return wrapper
