"""The node's measured rate of work for a model (storage/queue/backlog.py: how long its open backlog takes to drain)."""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal

from sqlalchemy import select
from sqlalchemy.orm import Session

from storage.models import EngineRun
from storage.planning.shapes import work
from storage.settings import Settings

DEFAULT_TOKENS_PER_SECOND = 1000.0


RECENT_RUNS = 20


MIN_MEASURED_SECONDS = 1.0


@dataclass(frozen=True)
class Throughput:
    """The node's rate of work for a model (output-token equivalents per second) and where it came from."""

    work_per_second: float
    output_tokens_per_second: float
    source: str  # "measured" or "default"
    runs: int


def measured_throughput(
    session: Session, *, model: str, prefill_weight: Decimal, recent_runs: int = RECENT_RUNS
) -> Throughput | None:
    """Work per busy second over the model's most recent runs (None with under a second measured)."""
    rows = session.execute(
        select(EngineRun.busy_seconds, EngineRun.prompt_tokens, EngineRun.completion_tokens)
        .where(EngineRun.model == model, EngineRun.busy_seconds > 0)
        .order_by(EngineRun.ended_at.desc().nulls_last(), EngineRun.started_at.desc())
        .limit(recent_runs)
    ).all()
    busy = sum(float(b) for b, _, _ in rows)
    output = sum(int(c) for _, _, c in rows)
    done = work(output_tokens=output, input_tokens=sum(int(p) for _, p, _ in rows), prefill_weight=prefill_weight)
    if busy < MIN_MEASURED_SECONDS or done <= 0:
        return None
    return Throughput(done / busy, output / busy, "measured", len(rows))


def throughput(
    session: Session, *, model: str, settings: Settings, default_tokens_per_second: float = DEFAULT_TOKENS_PER_SECOND
) -> Throughput:
    """The model's measured rate of work, or the default rate (source "default") before any measurement."""
    measured = measured_throughput(session, model=model, prefill_weight=settings.prefill_weight)
    return measured or Throughput(default_tokens_per_second, default_tokens_per_second, "default", 0)
