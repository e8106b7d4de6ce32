"""Engine runs: one stretch of busy engine time by one worker, the unit cost attribution splits.

The runner keeps a run's counters in memory and writes them here with every result flush, so the row is
current to within a flush and a run's results and its busy time always land in the same transaction.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import update
from sqlalchemy.orm import Session

from storage.models import EngineRun


@dataclass
class RunCounters:
    """What a run has done so far: busy time, steps, tokens, finished requests and slot occupancy (how full
    the running batch was while work was waiting). The runner keeps one per run; the probe reads it."""

    busy_seconds: float = 0.0
    steps: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    requests_finished: int = 0
    running_seq_steps: int = 0
    queued_steps: int = 0
    queued_running_seq_steps: int = 0

    def observe_step(self, running: int, waiting: int) -> None:
        """One engine step ran `running` sequences while `waiting` more were queued."""
        self.steps += 1
        self.running_seq_steps += running
        if waiting > 0:
            self.queued_steps += 1
            self.queued_running_seq_steps += running

    def add_results(self, *, prompt_tokens: int, completion_tokens: int, finished: int) -> None:
        """Results were flushed (or, with negative numbers, a failed flush is taken back)."""
        self.prompt_tokens += prompt_tokens
        self.completion_tokens += completion_tokens
        self.requests_finished += finished


def save_run(
    session: Session,
    *,
    run_id: str,
    worker_id: str,
    model: str,
    started_at: float,
    max_num_seqs: int,
    counters: RunCounters,
    ended_at: float,
    exists: bool,
) -> None:
    """Write the run's counters as of `ended_at`: update its row if it `exists` (and is still there), else insert it."""
    values = {**vars(counters), "ended_at": ended_at}
    if exists and session.execute(update(EngineRun).where(EngineRun.id == run_id).values(**values)).rowcount:  # type: ignore[attr-defined]
        return
    session.add(
        EngineRun(
            id=run_id, worker_id=worker_id, model=model, started_at=started_at, max_num_seqs=max_num_seqs, **values
        )
    )
