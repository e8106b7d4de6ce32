"""Before a job runs: what it will cost to compute and when it will finish, from measured throughput.

Work is counted as in `storage.costs`: output tokens + prefill_weight x input tokens. The node's rate of
work is measured from its recent engine runs of the model (work done / busy seconds); with no usable
measurement a default rate is assumed and the estimate says so. A JSONL file is sized without a
tokenizer: output = the line's max_completion_tokens or max_tokens (default 256; embeddings produce
none), input ~ bytes / 4. The backlog is every queued or running request of the model, sized the same
way once at ingest (`est_input_tokens`, `max_output_tokens`). `estimate_job` starts a job after the whole
backlog (the pessimistic case); admission (`admission_check`) projects the open jobs earliest deadline
first, as the queue serves them once they near their deadlines.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from storage import lifecycle
from storage.clock import now_f
from storage.costs import price_book, price_job
from storage.models import BatchRequest, EngineRun
from storage.pricing import CostBlock
from storage.settings import Settings, window_seconds

DEFAULT_MAX_TOKENS = 256
BYTES_PER_TOKEN = 4
DEFAULT_TOKENS_PER_SECOND = 1000.0
RECENT_RUNS = 20
MIN_MEASURED_SECONDS = 1.0
_NO_OUTPUT_URLS = frozenset({"/v1/embeddings"})


@dataclass(frozen=True)
class JobShape:
    """How much a job asks for: requests, approximate input tokens and maximum output tokens."""

    requests: int
    input_tokens: int
    output_tokens: int
    model: str | None = None
    skipped_lines: int = 0


def output_limit(body: Any, url: str | None, default_max_tokens: int = DEFAULT_MAX_TOKENS) -> int:
    """The most output tokens a request may produce: max_completion_tokens, max_tokens, or the default."""
    if url in _NO_OUTPUT_URLS:
        return 0
    for name in ("max_completion_tokens", "max_tokens"):
        value = body.get(name) if isinstance(body, dict) else None
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return default_max_tokens


def request_size(url: str, body: Any, *, line_bytes: int) -> tuple[int, int]:
    """(approximate input tokens, maximum output tokens) of one JSONL line of `line_bytes` bytes."""
    return -(-line_bytes // BYTES_PER_TOKEN), output_limit(body, url)


def _lines(chunks: Iterable[bytes]) -> Iterator[bytes]:
    rest = b""
    for chunk in chunks:
        rest += chunk
        *whole, rest = rest.split(b"\n")
        yield from whole
    yield rest


def shape_of_jsonl(chunks: Iterable[bytes], *, default_max_tokens: int = DEFAULT_MAX_TOKENS) -> JobShape:
    """Size a batch input file streamed in chunks; unparseable lines are counted, not sized."""
    requests = input_tokens = output_tokens = skipped = 0
    model: str | None = None
    for raw in _lines(chunks):
        if not raw.strip():
            continue
        try:
            line = json.loads(raw)
            body = line["body"]
        except (ValueError, KeyError, TypeError):
            skipped += 1
            continue
        requests += 1
        input_tokens += -(-len(raw) // BYTES_PER_TOKEN)
        output_tokens += output_limit(body, line.get("url"), default_max_tokens)
        if model is None and isinstance(body, dict) and isinstance(body.get("model"), str):
            model = body["model"]
    return JobShape(requests, input_tokens, output_tokens, model, skipped)


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
    work = output + float(prefill_weight) * sum(int(p) for _, p, _ in rows)
    if busy < MIN_MEASURED_SECONDS or work <= 0:
        return None
    return Throughput(work / busy, output / busy, "measured", len(rows))


@dataclass(frozen=True)
class OpenJob:
    """A job's unfinished (queued or running) requests: its deadline and the work they still ask for."""

    batch_id: str
    tenant_id: str
    deadline: int
    shape: JobShape


def open_jobs(session: Session, *, model: str, tenant_id: str | None = None) -> list[OpenJob]:
    """Each job's queued and running requests of the model (optionally one tenant's), as sized at ingest."""
    columns = (BatchRequest.batch_id, BatchRequest.tenant_id, BatchRequest.deadline)
    query = select(
        *columns, func.count(), func.sum(BatchRequest.est_input_tokens), func.sum(BatchRequest.max_output_tokens)
    ).where(BatchRequest.model == model, BatchRequest.status.in_(lifecycle.REQ_OPEN))
    if tenant_id is not None:
        query = query.where(BatchRequest.tenant_id == tenant_id)
    return [
        OpenJob(batch_id, tenant, int(deadline), JobShape(int(n), int(i or 0), int(o or 0), model))
        for batch_id, tenant, deadline, n, i, o in session.execute(query.group_by(*columns))
    ]


def backlog(session: Session, *, model: str) -> JobShape:
    """Queued and running requests of the model, as sized at ingest."""
    jobs = open_jobs(session, model=model)
    return JobShape(
        sum(j.shape.requests for j in jobs),
        sum(j.shape.input_tokens for j in jobs),
        sum(j.shape.output_tokens for j in jobs),
        model,
    )


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
) -> Estimate:
    """Estimate compute cost, start and finish of a job of `shape` submitted now behind the model's backlog."""
    if default_tokens_per_second <= 0:
        raise ValueError("the default throughput must be positive")
    at = now_f() if at is None else at
    weight = float(settings.prefill_weight)
    rate = measured_throughput(session, model=model, prefill_weight=settings.prefill_weight) or Throughput(
        default_tokens_per_second, default_tokens_per_second, "default", 0
    )
    queued = backlog(session, model=model)
    backlog_seconds = (queued.output_tokens + weight * queued.input_tokens) / rate.work_per_second
    job_seconds = (shape.output_tokens + weight * shape.input_tokens) / rate.work_per_second
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
        deadline_at=at + window_seconds(completion_window),
        cost=cost,
    )


def work_of(shape: JobShape, prefill_weight: Decimal) -> float:
    """Output-token equivalents of a shape: output + prefill_weight x input tokens."""
    return shape.output_tokens + float(prefill_weight) * shape.input_tokens


def throughput(
    session: Session, *, model: str, settings: Settings, default_tokens_per_second: float = DEFAULT_TOKENS_PER_SECOND
) -> Throughput:
    """The model's measured rate of work, or the default rate (source "default") before any measurement."""
    measured = measured_throughput(session, model=model, prefill_weight=settings.prefill_weight)
    return measured or Throughput(default_tokens_per_second, default_tokens_per_second, "default", 0)


def drain_seconds(session: Session, *, model: str, settings: Settings) -> float:
    """Seconds the node needs to finish every open request of `model` at its measured (or default) rate."""
    rate = throughput(session, model=model, settings=settings)
    return work_of(backlog(session, model=model), settings.prefill_weight) / rate.work_per_second


def edf_finish_times(
    jobs: Iterable[OpenJob], *, work_per_second: float, prefill_weight: Decimal, at: float
) -> dict[str, float]:
    """When each job finishes if the node serves open work earliest deadline first at `work_per_second`.

    Jobs with the same deadline share the node (the queue's fair share), so all of them finish when the
    last of them does. This is the classic EDF test: the set is feasible iff every job finishes in time.
    """
    by_deadline: dict[int, list[OpenJob]] = {}
    for job in jobs:
        by_deadline.setdefault(job.deadline, []).append(job)
    finish: dict[str, float] = {}
    clock = at
    for deadline in sorted(by_deadline):
        group = by_deadline[deadline]
        clock += sum(work_of(job.shape, prefill_weight) for job in group) / work_per_second
        finish.update((job.batch_id, clock) for job in group)
    return finish


@dataclass(frozen=True)
class Admission:
    """Whether a just-enqueued job (and the jobs accepted before it) can finish inside their windows."""

    batch_id: str
    deadline_at: int
    finish_at: float
    throughput: Throughput
    newly_late: tuple[str, ...]  # accepted jobs on time without this one but late with it

    @property
    def fits(self) -> bool:
        """True if this job finishes in its window and pushes no other job past its deadline."""
        return self.finish_at <= self.deadline_at and not self.newly_late


def admission_check(
    session: Session,
    *,
    batch_id: str,
    model: str,
    settings: Settings,
    jobs: list[OpenJob] | None = None,
    at: float | None = None,
) -> Admission:
    """Project the model's open work (`jobs`, read if not given), this batch's rows included, earliest
    deadline first at the measured speed."""
    at = now_f() if at is None else at
    rate = throughput(session, model=model, settings=settings)
    jobs = open_jobs(session, model=model) if jobs is None else jobs

    def project(selected: Iterable[OpenJob]) -> dict[str, float]:
        return edf_finish_times(
            selected, work_per_second=rate.work_per_second, prefill_weight=settings.prefill_weight, at=at
        )

    with_job = project(jobs)
    without = project(job for job in jobs if job.batch_id != batch_id)
    deadlines = {job.batch_id: job.deadline for job in jobs}
    newly_late = tuple(sorted(b for b, t in without.items() if t <= deadlines[b] < with_job[b]))
    return Admission(batch_id, deadlines.get(batch_id, 0), with_job.get(batch_id, at), rate, newly_late)
