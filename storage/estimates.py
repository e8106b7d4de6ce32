"""Before a job runs: what it will cost to compute and when it will finish, from measured throughput.

Work is counted as in `storage.costs`: output tokens + prefill_weight x input tokens. The node's rate of
work is measured from its recent engine runs of the model (work done / busy seconds); with no usable
measurement a default rate is assumed and the estimate says so. A JSONL file is sized without a
tokenizer: output = the line's max_completion_tokens or max_tokens (default 256; embeddings produce
none), input ~ bytes / 4. The backlog is every queued or running request of the model, sized the same
way from its stored body. The queue serves earliest deadline first and shares fairly between tenants,
so "start after the whole backlog" is the pessimistic case.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from sqlalchemy import Text, cast, func, select
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


def backlog(session: Session, *, model: str, default_max_tokens: int = DEFAULT_MAX_TOKENS) -> JobShape:
    """Queued and running requests of the model, sized like a file (grouped by their output limits)."""
    limits = (BatchRequest.body["max_completion_tokens"].as_string(), BatchRequest.body["max_tokens"].as_string())
    rows = session.execute(
        select(BatchRequest.url, *limits, func.count(), func.sum(func.length(cast(BatchRequest.body, Text))))
        .where(BatchRequest.model == model, BatchRequest.status.in_(lifecycle.REQ_OPEN))
        .group_by(BatchRequest.url, *limits)
    ).all()
    requests = input_tokens = output_tokens = 0
    for url, max_completion, max_tokens, count, body_bytes in rows:
        body = {"max_completion_tokens": _int(max_completion), "max_tokens": _int(max_tokens)}
        requests += int(count)
        input_tokens += -(-int(body_bytes or 0) // BYTES_PER_TOKEN)
        output_tokens += int(count) * output_limit(body, url, default_max_tokens)
    return JobShape(requests, input_tokens, output_tokens, model)


def _int(text: str | None) -> int | None:
    try:
        return int(str(text))
    except ValueError:
        return None


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
