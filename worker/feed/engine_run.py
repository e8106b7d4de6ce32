"""The engine run a runner is in: one stretch of busy time, stored as an `EngineRun` row for cost attribution
(storage/finance/engine_runs.py).

Its counters (busy time, steps, occupancy, tokens) go to the database with every flush of results, or alone every
RUN_WRITE_SECONDS while no result is on its way; the step samples (time, running, queued) feed the benchmarks'
occupancy plots (bench/engine.py). A run ends when the engine goes idle or has run `engine_run_max_seconds`.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections import deque
from collections.abc import Callable

from sqlalchemy.orm import Session

from storage.clock import now_f
from storage.finance.engine_runs import RunCounters, save_run
from storage.ids import new_id
from worker.engine import EngineResult, EngineStats

RUN_WRITE_SECONDS = 2.0  # counters alone (no result to store) are written this often, or by a forced flush
SAMPLE_SECONDS = 0.25


class EngineRunTally:
    """One runner's current engine run: its id, counters and step samples, and whether its row was written."""

    def __init__(self, *, worker_id: str, model: str, max_num_seqs: int) -> None:
        self.worker_id, self.model, self.max_num_seqs = worker_id, model, max_num_seqs
        self.samples: deque[tuple[float, int, int]] = deque(maxlen=14_400)  # (time, running, queued)
        self._last_sample = 0.0
        self._changed = False  # counters moved since the last write
        self._last_write = time.monotonic()
        self._begin()

    def _begin(self) -> None:
        self.run_id = new_id("run_")
        self.started = now_f()
        self.counters = RunCounters()
        self.written = False  # its row exists (save_run inserts it otherwise)

    def stepped(self, seconds: float, stats: EngineStats, *, finished: int, backlog: bool) -> None:
        """One engine step took `seconds`; `stats` are the engine's after it, `finished` requests ended in it, and
        `backlog` says the last claim found as many rows as it asked for."""
        # Work counts as queued if the engine has waiting sequences or the last claim found more rows than
        # it could take: a runner that let its engine drain while rows waited would show up here.
        queued = stats.waiting + (1 if backlog else 0)
        # Sequences that ran in this step: those still running plus those that finished in it (the engine
        # reports counts after the step, when finishers have already left and waiters not yet joined).
        running = min(self.max_num_seqs, stats.running + finished)
        self.counters.busy_seconds += seconds
        self.counters.observe_step(running, queued)
        self._changed = True
        if (now := time.monotonic()) - self._last_sample >= SAMPLE_SECONDS:
            self._last_sample = now
            self.samples.append((time.time(), running, queued))

    def finished(self, results: list[EngineResult]) -> None:
        """These results go to the database with the next counters written."""
        self.counters.add_results(
            prompt_tokens=sum(result.prompt_tokens for result in results),
            completion_tokens=sum(result.completion_tokens for result in results),
            finished=len(results),
        )

    def unwritten(self, *, force: bool) -> bool:
        """True if the counters moved since the last write and are due: forced, or RUN_WRITE_SECONDS old."""
        return self._changed and (force or time.monotonic() - self._last_write >= RUN_WRITE_SECONDS)

    def writer(self) -> Callable[[Session], None]:
        """Writes the counters as they are now (a snapshot: the writer thread may run it later); they count as
        written from here on. A row written before may be gone (a fresh database under a warm runner): save_run
        inserts it again."""
        write = functools.partial(
            save_run,
            run_id=self.run_id,
            worker_id=self.worker_id,
            model=self.model,
            started_at=self.started,
            max_num_seqs=self.max_num_seqs,
            counters=dataclasses.replace(self.counters),
            ended_at=now_f(),
            exists=self.written,
        )
        self.written, self._changed, self._last_write = True, False, time.monotonic()
        return write

    def too_long(self, max_seconds: float) -> bool:
        """True once the run has lasted more than `max_seconds`."""
        return now_f() - self.started > max_seconds

    def close(self) -> None:
        """The engine went idle (or the run is long enough): the next work starts a new run, once this one is
        written."""
        if self.written:
            self._begin()
