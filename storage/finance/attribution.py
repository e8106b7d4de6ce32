"""The attribution rule: who used which seconds of which engine run.

A run's measured busy seconds (time inside engine steps) are split across the batches whose *completed*
requests finished in it, by work = completion_tokens + prefill_weight x prompt_tokens, so the parts of a
run sum exactly to the run's busy time (`attribute_busy_seconds`). `attribute_runs` reads the runs and
their completed work in one grouped query and applies the rule; cost, reports and estimates all use it.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from fractions import Fraction
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from storage import lifecycle
from storage.finance.prices import to_decimal
from storage.models import BatchRequest, EngineRun
from storage.planning.shapes import exact_work

BILLED = BatchRequest.status == lifecycle.REQ_COMPLETED


def attribute_busy_seconds(
    run_busy_seconds: float | Decimal,
    shares: Mapping[str, tuple[int, int]],
    prefill_weight: Decimal = Decimal("0.2"),
) -> dict[str, Decimal]:
    """Split one engine run's busy time across jobs by work; the parts sum to the total exactly.

    `shares` maps a job id to (input_tokens, output_tokens); work = output + prefill_weight x input.
    Decode dominates: every output token is its own memory-bound pass over weights and KV cache, while
    prompt tokens go through prefill in parallel, compute-bound, many per pass. The default 0.2 is
    DeepSeek's published per-node rates (73.7k input tokens/s in prefill vs 14.8k output tokens/s in
    decode, a ratio of about 1:5, see shared/inference-economics.txt); prefix-cache hits make input
    cheaper still, so lower it for prompt-heavy, repetitive traffic.

    Exactness: the total is cut into indivisible grains (its own last digit, at most 1e-9 s), each job
    gets the floor of its exact share and the leftover grains go to the largest remainders (ties by
    job id), so the sum is the total to the last digit. Jobs with no tokens at all share equally only
    if every job has none.
    """
    if not shares:
        raise ValueError("no jobs to attribute busy time to")
    total = to_decimal(run_busy_seconds)
    if total < 0 or prefill_weight < 0:
        raise ValueError("busy seconds and prefill weight must not be negative")
    if any(i < 0 or o < 0 for i, o in shares.values()):
        raise ValueError("token counts must not be negative")
    exponent = min(int(total.as_tuple().exponent), -9)
    grains = int(total.scaleb(-exponent))
    work = {
        job: exact_work(output_tokens=o, input_tokens=i, prefill_weight=prefill_weight)
        for job, (i, o) in shares.items()
    }
    if not any(work.values()):
        work = dict.fromkeys(shares, Fraction(1))
    whole = sum(work.values())
    exact = {job: grains * w / whole for job, w in work.items()}
    parts = {job: int(x) for job, x in exact.items()}  # floor: every share is non-negative
    leftover = grains - sum(parts.values())
    by_remainder = sorted(exact, key=lambda job: (-(exact[job] - parts[job]), job))
    for job in by_remainder[:leftover]:
        parts[job] += 1
    return {job: Decimal(n).scaleb(exponent) for job, n in parts.items()}


@dataclass(frozen=True)
class RunShare:
    """One batch's part of one engine run: its billed tokens and requests, and its busy seconds."""

    run_id: str
    batch_id: str
    input_tokens: int
    output_tokens: int
    requests: int
    busy_seconds: Decimal


@dataclass(frozen=True)
class RunAttribution:
    """An engine run's measured busy time and how it splits across the batches that completed work in it."""

    run_id: str
    busy_seconds: Decimal
    mean_batch_size: Decimal | None
    shares: dict[str, RunShare] = field(default_factory=dict)


def attribute_runs(session: Session, *, run_ids: Iterable[str], prefill_weight: Decimal) -> dict[str, RunAttribution]:
    """Split each run's busy seconds across its batches' completed requests: one grouped query.

    Runs with no completed request (or no run row) are left out: they have nobody to bill.
    """
    wanted = sorted(set(run_ids))
    if not wanted:
        return {}
    rows = session.execute(
        select(
            BatchRequest.run_id,
            BatchRequest.batch_id,
            func.sum(BatchRequest.prompt_tokens),
            func.sum(BatchRequest.completion_tokens),
            func.count(),
            EngineRun.busy_seconds,
            EngineRun.steps,
            EngineRun.running_seq_steps,
        )
        .join(EngineRun, EngineRun.id == BatchRequest.run_id)
        .where(BILLED, BatchRequest.run_id.in_(wanted))
        .group_by(BatchRequest.run_id, BatchRequest.batch_id, EngineRun.id)
    ).all()
    grouped: dict[str, list[Any]] = defaultdict(list)
    for row in rows:
        grouped[str(row[0])].append(row)
    return {run_id: _attribute_one(run_id, run_rows, prefill_weight) for run_id, run_rows in grouped.items()}


def _attribute_one(run_id: str, rows: list[Any], prefill_weight: Decimal) -> RunAttribution:
    _, _, _, _, _, busy, steps, running_seq_steps = rows[0]
    tokens = {batch_id: (int(i or 0), int(o or 0)) for _, batch_id, i, o, *_ in rows}
    parts = attribute_busy_seconds(max(float(busy or 0), 0.0), tokens, prefill_weight)
    shares = {
        batch_id: RunShare(run_id, batch_id, tokens[batch_id][0], tokens[batch_id][1], int(count), parts[batch_id])
        for _, batch_id, _, _, count, *_ in rows
    }
    mean = Decimal(int(running_seq_steps)) / int(steps) if steps else None
    return RunAttribution(run_id, sum(parts.values(), Decimal(0)), mean, shares)


def served_batch_size(parts: Iterable[tuple[RunShare, Decimal | None]]) -> Decimal | None:
    """Runs' mean running batch weighted by the job's completion tokens in each (None without tokens)."""
    weighted = [(share.output_tokens, mean) for share, mean in parts if mean is not None and share.output_tokens > 0]
    tokens = sum(t for t, _ in weighted)
    if not tokens:
        return None
    return sum((t * mean for t, mean in weighted), Decimal(0)) / tokens
