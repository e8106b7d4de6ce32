"""Per-job cost from measured engine time: who used which seconds of which engine run.

The rule:

1. Each engine run records its measured busy seconds (time spent inside engine steps) and each
   request that finished in it carries `run_id` and its prompt and completion tokens.
2. A run's busy seconds are split across the batches whose *completed* requests finished in that run,
   by work = completion_tokens + prefill_weight x prompt_tokens (`pricing.attribute_busy_seconds`),
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
from datetime import date, datetime
from decimal import Decimal
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from storage.finance.attribution import _BILLED, attribute_runs, served_batch_size
from storage.finance.prices import ANY_MODEL, CostBlock, PriceBook, cost_block
from storage.models import Batch, BatchRequest
from storage.settings import Settings

_SECONDS_PER_HOUR = Decimal(3600)


def price_book(settings: Settings) -> PriceBook:
    """The price book the settings describe: list prices, window discounts and the node's rent."""
    return PriceBook.from_dict(
        {
            **settings.price_book,
            "completion_windows": settings.completion_windows,
            "gpu_count": settings.gpu_count,
            "usd_per_gpu_hour": settings.gpu_hour_usd,
        }
    )


def compute_usd(busy_seconds: Decimal, book: PriceBook) -> Decimal:
    """What `busy_seconds` of the whole node cost: seconds x GPUs x price per GPU-hour / 3600."""
    return busy_seconds * book.gpu_count * book.usd_per_gpu_hour / _SECONDS_PER_HOUR


def price_job(
    book: PriceBook,
    *,
    model: str | None,
    created_at: datetime | date | float,
    completion_window: str,
    input_tokens: int,
    output_tokens: int,
    busy_seconds: Decimal,
    mean_batch_size: Decimal | None = None,
) -> CostBlock:
    """A cost block at the list price of `created_at` and the window's discount (0 if no longer offered)."""
    return cost_block(
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        busy_seconds=busy_seconds,
        gpu_count=book.gpu_count,
        usd_per_gpu_hour=book.usd_per_gpu_hour,
        discount=book.window_discounts.get(completion_window, Decimal(0)),
        price=book.price_for(model or ANY_MODEL, created_at),
        mean_batch_size=mean_batch_size,
    )


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
    """The job's cost block from its completed requests and their runs (None when nothing is billable yet)."""
    own = session.execute(
        select(
            BatchRequest.run_id,
            func.sum(BatchRequest.prompt_tokens),
            func.sum(BatchRequest.completion_tokens),
            func.count(),
        )
        .where(BatchRequest.batch_id == batch.id, _BILLED)
        .group_by(BatchRequest.run_id)
    ).all()
    if not own:
        return None
    runs = attribute_runs(
        session, run_ids=(run_id for run_id, *_ in own if run_id), prefill_weight=settings.prefill_weight
    )
    shares = [run.shares[batch.id] for run in runs.values() if batch.id in run.shares]
    return price_job(
        price_book(settings),
        model=batch.model,
        created_at=batch.created_at,
        completion_window=batch.completion_window,
        input_tokens=sum(int(i or 0) for _, i, _, _ in own),
        output_tokens=sum(int(o or 0) for _, _, o, _ in own),
        busy_seconds=sum((share.busy_seconds for share in shares), Decimal(0)),
        mean_batch_size=served_batch_size((share, runs[share.run_id].mean_batch_size) for share in shares),
    )


def batch_cost_json(session: Session, batch: Batch, settings: Settings) -> dict[str, Any] | None:
    """The job's cost block as JSON (Decimal strings), for the `cost` extension of the batch object."""
    block = batch_cost(session, batch=batch, settings=settings)
    return None if block is None else block.to_json()
