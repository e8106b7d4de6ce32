"""Engine runs: one stretch of busy engine time by one worker, the unit cost attribution splits.

The runner keeps a run's counters in memory and writes them here with every result flush, so the row is
current to within a flush and a run's results and its busy time always land in the same transaction.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import update
from sqlalchemy.orm import Session

from storage.models import EngineRun


@dataclass(frozen=True)
class RunCounters:
    """What a run has done so far: busy time, steps, tokens, finished requests and slot occupancy."""

    ended_at: float
    busy_seconds: float
    steps: int
    prompt_tokens: int
    completion_tokens: int
    requests_finished: int
    running_seq_steps: int
    queued_steps: int
    queued_running_seq_steps: int


def save_run(
    session: Session,
    *,
    run_id: str,
    worker_id: str,
    model: str,
    started_at: float,
    max_num_seqs: int,
    counters: RunCounters,
    exists: bool,
) -> None:
    """Write the run's counters: update its row if it `exists` (and is still there), else insert it."""
    values = vars(counters)
    if exists and session.execute(update(EngineRun).where(EngineRun.id == run_id).values(**values)).rowcount:  # type: ignore[attr-defined]
        return
    session.add(
        EngineRun(
            id=run_id, worker_id=worker_id, model=model, started_at=started_at, max_num_seqs=max_num_seqs, **values
        )
    )
