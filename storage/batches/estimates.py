"""Before a job runs: what it will cost to compute and when it will finish, from measured throughput.

Work is counted as in `storage.finance.attribution`: output tokens + prefill_weight x input tokens. The node's rate of
work is measured from its recent engine runs of the model (work done / busy seconds); with no usable
measurement a default rate is assumed and the estimate says so. A JSONL file is sized without a
tokenizer: output = the line's max_completion_tokens or max_tokens (default 256; embeddings produce
none), input ~ bytes / 4 with an estimate per image (storage/planning/shapes.py `request_size`). The backlog
is every queued or running request of the model, sized the same way once at ingest (`est_input_tokens`,
`max_output_tokens`). `estimate_job` starts a job after the whole backlog (the pessimistic case); admission
(`admission_check`) projects the open jobs earliest deadline first, as the queue serves them once they near their
deadlines, and the estimate's `windows` menu (storage/batches/window_menu.py) is that projection for each offered
window: the finish, price and verdict a create on it would get.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from sqlalchemy.orm import Session

from storage.batches.window_menu import WindowOption, window_menu
from storage.clock import now_f
from storage.finance.prices import CostBlock, price_book, price_job
from storage.planning.shapes import JobShape, work_of
from storage.planning.throughput import DEFAULT_TOKENS_PER_SECOND, Throughput, throughput
from storage.queue.backlog import backlog, shape_with_lora_work
from storage.settings import Settings
from storage.windows import BACKGROUND_DEADLINE, is_background_window, window_seconds


@dataclass(frozen=True)
class Estimate:
    """A job's estimated compute cost and schedule (times in unix seconds)."""

    model: str
    completion_window: str
    job: JobShape
    backlog: JobShape
    throughput: Throughput
    backlog_seconds: float
    job_seconds: float
    start_at: float
    finish_at: float
    deadline_at: float
    cost: CostBlock
    windows: tuple[WindowOption, ...] = ()  # the menu: every offered window (storage/batches/window_menu.py)

    @property
    def fits_window(self) -> bool:
        """True if the job is expected to finish before its completion window closes."""
        return self.finish_at <= self.deadline_at

    def to_json(self) -> dict[str, Any]:
        """JSON-ready: money as rounded Decimal strings, times as whole unix seconds."""
        cost = self.cost.to_json()
        cost.pop("mean_batch_size")
        return {
            "object": "batch.estimate",
            "model": self.model,
            "completion_window": self.completion_window,
            "requests": self.job.requests,
            "skipped_lines": self.job.skipped_lines,
            "problems": [problem.to_json() for problem in self.job.problems],
            "throughput": {
                "work_per_second": round(self.throughput.work_per_second, 3),
                "output_tokens_per_second": round(self.throughput.output_tokens_per_second, 3),
                "source": self.throughput.source,
                "runs": self.throughput.runs,
            },
            "backlog": {"requests": self.backlog.requests, "output_tokens": self.backlog.output_tokens},
            "backlog_seconds": round(self.backlog_seconds, 3),
            "job_seconds": round(self.job_seconds, 3),
            "start_at": int(self.start_at),
            "finish_at": int(self.finish_at),
            "deadline_at": int(self.deadline_at),
            "fits_window": self.fits_window,
            "cost": cost,
            "windows": [option.to_json() for option in self.windows],
        }


def estimate_job(
    session: Session,
    *,
    model: str,
    shape: JobShape,
    settings: Settings,
    completion_window: str = "24h",
    default_tokens_per_second: float = DEFAULT_TOKENS_PER_SECOND,
    at: float | None = None,
    tenant_id: str | None = None,
) -> Estimate:
    """Estimate compute cost, start and finish of a job of `shape` submitted now behind the model's backlog, and
    the menu of every offered window (admission's projection; `tenant_id`: whose quota applies)."""
    if default_tokens_per_second <= 0:
        raise ValueError("the default throughput must be positive")
    at = now_f() if at is None else at
    shape = shape_with_lora_work(session, settings, model=model, shape=shape)  # adapter lines weigh as admission's
    rate = throughput(session, model=model, settings=settings, default_tokens_per_second=default_tokens_per_second)
    queued = backlog(session, settings, model=model)
    backlog_seconds = work_of(queued, settings.prefill_weight) / rate.work_per_second
    job_seconds = work_of(shape, settings.prefill_weight) / rate.work_per_second
    cost = price_job(
        price_book(settings),
        model=model,
        created_at=at,
        completion_window=completion_window,
        input_tokens=shape.input_tokens,
        output_tokens=shape.output_tokens,
        busy_seconds=Decimal(repr(job_seconds)),
    )
    start = at + backlog_seconds
    return Estimate(
        model=model,
        completion_window=completion_window,
        job=shape,
        backlog=queued,
        throughput=rate,
        backlog_seconds=backlog_seconds,
        job_seconds=job_seconds,
        start_at=start,
        finish_at=start + job_seconds,
        deadline_at=BACKGROUND_DEADLINE
        if is_background_window(completion_window)
        else at + window_seconds(completion_window),
        cost=cost,
        windows=window_menu(
            session,
            settings,
            model=model,
            shape=shape,
            rate=rate,
            at=at,
            job_seconds=job_seconds,
            tenant_id=tenant_id,
        ),
    )
