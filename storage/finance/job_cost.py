"""Per-job cost from measured engine time: who used which seconds of which engine run.

The rule:

1. Each engine run records its measured busy seconds (time spent inside engine steps) and each
   request that finished in it carries `run_id` and its prompt and completion tokens.
2. A run's busy seconds are split across the batches whose *completed* requests finished in that run,
   by work = completion_tokens + prefill_weight x prompt_tokens (`storage.finance.attribution`),
   so the parts of a run sum exactly to the run's busy time.
3. A job's compute cost = its attributed busy seconds x gpu_count x gpu_hour_usd / 3600.
4. Only completed requests are billed or attributed. Failed, expired and cancelled requests are
   neither, so busy time a run spent on requests that later failed is carried by the completed
   requests of that run: the node's cost is always fully recovered from the work that succeeded.
5. The list price is the one in force on the day the batch was created, and the discount is that of
   its completion window (a window no longer offered earns no discount).
6. The mean running batch a job was served at is each run's mean running batch
   (running_seq_steps / steps) weighted by the job's completion tokens in that run.

A run stays open while its worker keeps going, so a job's compute cost is provisional until every run
it used has ended: later steps of the run and later finishers can move the split slightly. Money is
Decimal throughout and rounded only in `CostBlock.to_json()`.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from storage.finance.attribution import BILLED, attribute_runs, served_batch_size
from storage.finance.prices import CostBlock, compute_usd, price_book, price_job
from storage.models import Batch, BatchRequest
from storage.settings import Settings


@dataclass(frozen=True)
class RunCosts:
    """One run's measured cost and each batch's attributed part of it."""

    run_id: str
    busy_seconds: Decimal
    compute_usd: Decimal
    batch_busy_seconds: dict[str, Decimal]
    batch_compute_usd: dict[str, Decimal]


def run_costs(session: Session, run_id: str, *, settings: Settings) -> RunCosts | None:
    """The run's measured compute cost and its split per batch (None if no completed request ran in it)."""
    run = attribute_runs(session, run_ids=[run_id], prefill_weight=settings.prefill_weight).get(run_id)
    if run is None:
        return None
    book = price_book(settings)
    return RunCosts(
        run_id=run_id,
        busy_seconds=run.busy_seconds,
        compute_usd=compute_usd(run.busy_seconds, book),
        batch_busy_seconds={b: s.busy_seconds for b, s in run.shares.items()},
        batch_compute_usd={b: compute_usd(s.busy_seconds, book) for b, s in run.shares.items()},
    )


def batch_cost(session: Session, *, batch: Batch, settings: Settings) -> CostBlock | None:
    """The job's cost block from its completed requests and their runs (None when nothing is billable yet).

    Tokens are priced at their own model's list price, so a batch mixing models (a protocol
    may allow it) sums one priced part per model; an engine run serves one model, so its share goes with it.
    """
    own = session.execute(
        select(
            BatchRequest.run_id,
            BatchRequest.model,
            func.sum(BatchRequest.prompt_tokens),
            func.sum(BatchRequest.completion_tokens),
            func.sum(BatchRequest.cached_tokens),
        )
        .where(BatchRequest.batch_id == batch.id, BILLED)
        .group_by(BatchRequest.run_id, BatchRequest.model)
    ).all()
    if not own:
        return None
    runs = attribute_runs(
        session, run_ids=(run_id for run_id, *_ in own if run_id), prefill_weight=settings.prefill_weight
    )
    shares = [run.shares[batch.id] for run in runs.values() if batch.id in run.shares]
    model_of_run = {run_id: model for run_id, model, *_ in own}
    book = price_book(settings)
    parts = []
    for model in sorted({model for _, model, *_ in own}):
        mine = [share for share in shares if model_of_run.get(share.run_id) == model]
        parts.append(
            price_job(
                book,
                model=model,
                created_at=batch.created_at,
                completion_window=batch.completion_window,
                input_tokens=sum(int(i or 0) for _, m, i, _, _ in own if m == model),
                output_tokens=sum(int(o or 0) for _, m, _, o, _ in own if m == model),
                busy_seconds=sum((share.busy_seconds for share in mine), Decimal(0)),
                cached_input_tokens=sum(int(c or 0) for _, m, _, _, c in own if m == model),
            )
        )
    mean = served_batch_size((share, runs[share.run_id].mean_batch_size) for share in shares)
    return _combined(parts, mean_batch_size=mean)


def _combined(parts: list[CostBlock], *, mean_batch_size: Decimal | None) -> CostBlock:
    """One block for a job priced in parts (one per model): amounts add up, the discount is the window's.

    The cached-input price is shown only when every part has the same one (mixed models: per model)."""
    cached_prices = {p.cached_input_usd_per_mtok for p in parts}
    return CostBlock(
        input_tokens=sum(p.input_tokens for p in parts),
        output_tokens=sum(p.output_tokens for p in parts),
        list_usd=sum((p.list_usd for p in parts), Decimal(0)),
        discount_pct=parts[0].discount_pct,
        discount_usd=sum((p.discount_usd for p in parts), Decimal(0)),
        billed_usd=sum((p.billed_usd for p in parts), Decimal(0)),
        gpu_seconds=sum((p.gpu_seconds for p in parts), Decimal(0)),
        compute_usd=sum((p.compute_usd for p in parts), Decimal(0)),
        margin_usd=sum((p.margin_usd for p in parts), Decimal(0)),
        mean_batch_size=mean_batch_size,
        cached_input_tokens=sum(p.cached_input_tokens for p in parts),
        cached_input_usd_per_mtok=cached_prices.pop() if len(cached_prices) == 1 else None,
    )


def batch_cost_json(session: Session, batch: Batch, settings: Settings) -> dict[str, Any] | None:
    """The job's cost block as JSON (Decimal strings), for the `cost` extension of the batch object."""
    block = batch_cost(session, batch=batch, settings=settings)
    return None if block is None else block.to_json()
