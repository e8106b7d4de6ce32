"""What the runner reports to Prometheus: each runner owns one probe and feeds it what it has.

`claimed` sees each claim (leases, re-claims, claim times); `flushed` runs after each results transaction
and turns the run's counters (busy time, steps, occupancy, kept per engine run) into counter increments,
sets the engine gauges and observes each request's claim-to-commit latency. The probe is handed values,
never the runner; nothing the runner decides depends on it.
"""

from __future__ import annotations

import time
from collections.abc import Collection

from storage.finance.engine_runs import RunCounters
from storage.metrics import events
from storage.queue.claim import ClaimedRequest
from worker.engine import EngineResult, EngineStats


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

    def flushed(
        self,
        results: list[EngineResult],
        *,
        run_id: str,
        counters: RunCounters,
        inflight: Collection[str],
        stats: EngineStats,
        slots: int,
    ) -> None:
        """Results were committed: tokens, outcomes, latency, and the engine's counters and gauges."""
        model, at = self.model, time.monotonic()
        for result in results:
            events.ENGINE_RESULTS.labels(model, "completed" if result.ok else "failed").inc()
            claimed = self._claimed_at.pop(result.request_id, None)
            if claimed is not None:
                events.RESULT_LATENCY.labels(model).observe(at - claimed)
        events.PROMPT_TOKENS.labels(model).inc(sum(r.prompt_tokens for r in results))
        events.OUTPUT_TOKENS.labels(model).inc(sum(r.completion_tokens for r in results))
        for request_id in [rid for rid in self._claimed_at if rid not in inflight]:
            del self._claimed_at[request_id]  # aborted or lost: no result will come
        self._engine_counters(run_id, counters)
        events.ENGINE_RUNNING.labels(model).set(stats.running)
        events.ENGINE_WAITING.labels(model).set(stats.waiting)
        events.ENGINE_INFLIGHT.labels(model).set(len(inflight))
        events.ENGINE_SLOTS.labels(model).set(slots)
        if "adapter_swaps" in stats.extra:
            events.ADAPTER_LOADS.labels(model).set(stats.extra["adapter_loads"])
            events.ADAPTER_SWAPS.labels(model).set(stats.extra["adapter_swaps"])

    def _engine_counters(self, run_id: str, counters: RunCounters) -> None:
        c = counters
        now = (c.busy_seconds, c.steps, c.running_seq_steps, c.queued_steps, c.queued_running_seq_steps)
        before = self._seen if run_id == self._run_id else (0.0, 0, 0, 0, 0)
        self._run_id, self._seen = run_id, now
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
