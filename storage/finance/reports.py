"""Finance reports: what was used and what it cost, per UTC day, optionally per tenant, model and window.

A request counts on the UTC day it finished (`finished_at`). Cost rows use exactly the rule of
`storage.finance.attribution`: each (run, batch) part of a run's busy time is spread over the days that batch's
requests finished in that run by their work, so a day's row is the sum of its jobs' cost blocks and,
once every request of a run completed, the run's whole measured cost. Aggregation is done in SQL per
(day, batch, run); Python only prices those groups and adds them up.
"""

from __future__ import annotations

import csv
import io
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import ROUND_HALF_UP, Decimal
from typing import Any

from sqlalchemy import ColumnElement, Integer, cast, func, literal_column, select
from sqlalchemy.orm import Session

from storage import lifecycle
from storage.errors import InvalidRequest
from storage.finance.attribution import RunShare, attribute_busy_seconds, attribute_runs
from storage.finance.prices import price_book, price_job, usd_text
from storage.lines.reader import clip
from storage.models import Batch, BatchRequest
from storage.settings import Settings

DAY_SECONDS = 86400
MAX_DAYS = 366
BUCKET_WIDTHS = ("1d",)
# group_by value -> the result field it fills
GROUP_FIELDS = {
    "tenant": "tenant_id",
    "model": "model",
    "completion_window": "completion_window",
    "protocol": "protocol",  # the API the batch came through (storage/protocols.py)
}
_GROUP_COLUMNS = {
    "tenant": BatchRequest.tenant_id,
    "model": BatchRequest.model,
    "completion_window": Batch.completion_window,
    "protocol": Batch.protocol,
}


def parse_group_by(values: Sequence[str] | None) -> tuple[str, ...]:
    """Repeated and/or comma-separated group_by values, validated and in canonical order."""
    wanted = {part.strip() for value in values or () for part in value.split(",") if part.strip()}
    unknown = wanted - set(GROUP_FIELDS)
    if unknown:
        raise InvalidRequest(
            f"Invalid group_by {clip(', '.join(sorted(unknown)))}: use any of {', '.join(GROUP_FIELDS)}.",
            param="group_by",
        )
    return tuple(name for name in GROUP_FIELDS if name in wanted)


def check_window(*, start_time: int, end_time: int, bucket_width: str = "1d") -> None:
    """Reject an unsupported bucket width or a window that is empty or longer than MAX_DAYS."""
    if bucket_width not in BUCKET_WIDTHS:
        raise InvalidRequest(f"Invalid bucket_width '{bucket_width}': only '1d' is supported.", param="bucket_width")
    if end_time <= start_time:
        raise InvalidRequest("end_time must be after start_time.", param="end_time")
    if _day(end_time - 1) - _day(start_time) >= MAX_DAYS:
        raise InvalidRequest(f"The window may span at most {MAX_DAYS} days.", param="end_time")


def _day(at: float) -> int:
    return int(at // DAY_SECONDS)


def _day_index(session: Session) -> ColumnElement[int]:
    """floor(finished_at / 86400) in SQL; the divisor is inlined so GROUP BY repeats the same text."""
    days = BatchRequest.finished_at / literal_column(str(DAY_SECONDS))
    if session.get_bind().dialect.name == "sqlite":
        return cast(days, Integer)  # truncation is floor for the non-negative epoch seconds stored
    return cast(func.floor(days), Integer)


@dataclass
class CostResult:
    """One row of a day: money and tokens of one group (or of everything when not grouped)."""

    group: dict[str, str | None]
    list_usd: Decimal = Decimal(0)
    discount_usd: Decimal = Decimal(0)
    billed_usd: Decimal = Decimal(0)
    compute_usd: Decimal = Decimal(0)
    gpu_seconds: Decimal = Decimal(0)
    input_tokens: int = 0
    output_tokens: int = 0
    num_model_requests: int = 0
    input_cached_tokens: int = 0

    @property
    def margin_usd(self) -> Decimal:
        """Billed minus compute."""
        return self.billed_usd - self.compute_usd

    def to_json(self) -> dict[str, Any]:
        """OpenAI's costs result with Backfill's breakdown; money as Decimal strings rounded here."""
        return {
            "object": "organization.costs.result",
            "amount": {"value": usd_text(self.billed_usd), "currency": "usd"},
            "list_usd": usd_text(self.list_usd),
            "billed_usd": usd_text(self.billed_usd),
            "discount_usd": usd_text(self.discount_usd),
            "compute_usd": usd_text(self.compute_usd),
            "margin_usd": usd_text(self.margin_usd),
            "gpu_seconds": str(self.gpu_seconds.quantize(Decimal("0.001"), ROUND_HALF_UP)),
            "input_tokens": self.input_tokens,
            "input_cached_tokens": self.input_cached_tokens,
            "output_tokens": self.output_tokens,
            "num_model_requests": self.num_model_requests,
            **self.group,
        }


@dataclass
class UsageResult:
    """Tokens and request counts of one group in one day."""

    group: dict[str, str | None]
    input_tokens: int = 0
    output_tokens: int = 0
    num_model_requests: int = 0
    num_failed_requests: int = 0

    def to_json(self) -> dict[str, Any]:
        """OpenAI's usage result shape; failed counts failed, expired and cancelled requests."""
        return {
            "object": "organization.usage.result",
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "num_model_requests": self.num_model_requests,
            "num_failed_requests": self.num_failed_requests,
            "batch": True,
            **self.group,
        }


@dataclass
class Bucket:
    """One UTC day and its rows."""

    start_time: int
    end_time: int
    results: list[Any] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        """OpenAI's bucket object."""
        return {
            "object": "bucket",
            "start_time": self.start_time,
            "end_time": self.end_time,
            "results": [result.to_json() for result in self.results],
        }


def page_json(buckets: list[Bucket]) -> dict[str, Any]:
    """OpenAI's page of buckets (one page: the window is capped at MAX_DAYS)."""
    return {"object": "page", "data": [b.to_json() for b in buckets], "has_more": False, "next_page": None}


def day_buckets(start_time: int, end_time: int, rows: dict[int, list[Any]]) -> list[Bucket]:
    """One bucket per UTC day of [start_time, end_time), holding that day's rows (empty days included)."""
    return [
        Bucket(day * DAY_SECONDS, (day + 1) * DAY_SECONDS, rows.get(day, []))
        for day in range(_day(start_time), _day(end_time - 1) + 1)
    ]


def _base_filters(start_time: int, end_time: int, tenant_id: str | None) -> list[ColumnElement[bool]]:
    filters = [BatchRequest.finished_at >= start_time, BatchRequest.finished_at < end_time]
    if tenant_id is not None:
        filters.append(BatchRequest.tenant_id == tenant_id)
    return filters


def cost_report(
    session: Session,
    *,
    settings: Settings,
    start_time: int,
    end_time: int,
    tenant_id: str | None = None,
    group_by: Sequence[str] = (),
) -> list[Bucket]:
    """Per-day cost rows of completed requests finished in [start_time, end_time), grouped as asked."""
    check_window(start_time=start_time, end_time=end_time)
    day = _day_index(session)
    rows = session.execute(
        select(
            day,
            BatchRequest.batch_id,
            BatchRequest.run_id,
            BatchRequest.tenant_id,
            BatchRequest.model,
            Batch.completion_window,
            Batch.created_at,
            Batch.protocol,
            func.sum(BatchRequest.prompt_tokens),
            func.sum(BatchRequest.completion_tokens),
            func.count(),
            func.sum(BatchRequest.cached_tokens),
        )
        .join(Batch, Batch.id == BatchRequest.batch_id)
        .where(BatchRequest.status == lifecycle.REQ_COMPLETED, *_base_filters(start_time, end_time, tenant_id))
        .group_by(day, BatchRequest.batch_id, BatchRequest.run_id, Batch.id, BatchRequest.tenant_id, BatchRequest.model)
    ).all()
    runs = attribute_runs(session, run_ids=(r[2] for r in rows if r[2]), prefill_weight=settings.prefill_weight)
    book = price_book(settings)
    # (day, batch, model) -> [input, output, requests, busy seconds, cached input]; a batch may mix models
    # (storage/protocols.py `one_model`), an engine run serves one, so a (run, batch) share belongs to one model.
    jobs: dict[tuple[int, str, str], list[Any]] = defaultdict(lambda: [0, 0, 0, Decimal(0), 0])
    info: dict[str, tuple[str, str, int, str]] = {}
    days_of: dict[tuple[str, str], dict[int, tuple[int, int]]] = defaultdict(dict)  # (run, batch) -> day -> tokens
    model_of: dict[tuple[str, str], str] = {}
    for day_index, batch_id, run_id, tenant, model, window, created, protocol, i, o, n, c in rows:
        job = jobs[(int(day_index), batch_id, model)]
        job[0] += int(i or 0)
        job[1] += int(o or 0)
        job[2] += int(n)
        job[4] += int(c or 0)
        info[batch_id] = (tenant, window, created, protocol)
        if run_id in runs and batch_id in runs[run_id].shares:
            days_of[(run_id, batch_id)][int(day_index)] = (int(i or 0), int(o or 0))
            model_of[(run_id, batch_id)] = model
    for (run_id, batch_id), days in days_of.items():
        for day_index, busy in _spread_over_days(runs[run_id].shares[batch_id], days, settings.prefill_weight).items():
            jobs[(day_index, batch_id, model_of[(run_id, batch_id)])][3] += busy
    table: dict[int, dict[tuple[str | None, ...], CostResult]] = defaultdict(dict)
    for (day_index, batch_id, model), (i, o, n, busy, cached) in jobs.items():
        tenant, window, created, protocol = info[batch_id]
        block = price_job(
            book,
            model=model,
            created_at=created,
            completion_window=window,
            input_tokens=i,
            output_tokens=o,
            busy_seconds=busy,
            cached_input_tokens=cached,
        )
        values = {"tenant": tenant, "model": model, "completion_window": window, "protocol": protocol}
        group = _group(values, group_by)
        result = table[day_index].setdefault(tuple(group.values()), CostResult(group))
        result.list_usd += block.list_usd
        result.discount_usd += block.discount_usd
        result.billed_usd += block.billed_usd
        result.compute_usd += block.compute_usd
        result.gpu_seconds += block.gpu_seconds
        result.input_tokens += i
        result.input_cached_tokens += cached
        result.output_tokens += o
        result.num_model_requests += n
    return day_buckets(start_time, end_time, {d: sorted_groups(results) for d, results in table.items()})


def _spread_over_days(share: RunShare, days: dict[int, tuple[int, int]], weight: Decimal) -> dict[int, Decimal]:
    """A (run, batch) share's busy seconds per day of the window, by the one attribution rule.

    The share covers every day its requests finished on, inside the report window or not, so the work
    outside the window keeps its part and a day's figure never depends on the window asked for.
    """
    tokens = {f"{day:08d}": part for day, part in days.items()}
    outside = (
        share.input_tokens - sum(i for i, _ in days.values()),
        share.output_tokens - sum(o for _, o in days.values()),
    )
    if outside != (0, 0):
        tokens["outside"] = (max(outside[0], 0), max(outside[1], 0))
    parts = attribute_busy_seconds(share.busy_seconds, tokens, weight)
    return {day: parts[f"{day:08d}"] for day in days}


def _group(values: dict[str, str], group_by: Sequence[str]) -> dict[str, str | None]:
    return {GROUP_FIELDS[name]: values[name] for name in group_by}


def sorted_groups(results: dict[tuple[str | None, ...], Any]) -> list[Any]:
    """A day's results in the order of their group values (missing values first)."""
    return [results[key] for key in sorted(results, key=lambda k: tuple(v or "" for v in k))]


def usage_report(
    session: Session,
    *,
    start_time: int,
    end_time: int,
    tenant_id: str | None = None,
    group_by: Sequence[str] = (),
) -> list[Bucket]:
    """Per-day tokens and request counts of requests finished in [start_time, end_time)."""
    check_window(start_time=start_time, end_time=end_time)
    day = _day_index(session)
    keys = [_GROUP_COLUMNS[name] for name in group_by]
    rows = session.execute(
        select(
            day,
            BatchRequest.status,
            *keys,
            func.sum(BatchRequest.prompt_tokens),
            func.sum(BatchRequest.completion_tokens),
            func.count(),
        )
        .join(Batch, Batch.id == BatchRequest.batch_id)
        .where(BatchRequest.status.in_(lifecycle.REQ_TERMINAL), *_base_filters(start_time, end_time, tenant_id))
        .group_by(day, BatchRequest.status, *keys)
    ).all()
    table: dict[int, dict[tuple[str | None, ...], UsageResult]] = defaultdict(dict)
    for day_index, status, *rest in rows:
        values, (i, o, n) = rest[: len(keys)], rest[len(keys) :]
        group = {GROUP_FIELDS[name]: value for name, value in zip(group_by, values, strict=True)}
        result = table[int(day_index)].setdefault(tuple(group.values()), UsageResult(group))
        if status == lifecycle.REQ_COMPLETED:
            result.input_tokens += int(i or 0)
            result.output_tokens += int(o or 0)
            result.num_model_requests += int(n)
        else:
            result.num_failed_requests += int(n)
    return day_buckets(start_time, end_time, {d: sorted_groups(results) for d, results in table.items()})


def to_csv(buckets: list[Bucket], *, kind: str, group_by: Sequence[str] = ()) -> str:
    """The same rows as the JSON page, one line per (day, group), with the day as an ISO date too.

    `kind` is "costs" or "usage"; it fixes the header so an empty report still has one.
    """
    template = (CostResult if kind == "costs" else UsageResult)({GROUP_FIELDS[n]: None for n in group_by})
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=list(_csv_row(Bucket(0, 0), template)), lineterminator="\n")
    writer.writeheader()
    for bucket in buckets:
        writer.writerows(_csv_row(bucket, result) for result in bucket.results)
    return out.getvalue()


def _csv_row(bucket: Bucket, result: CostResult | UsageResult) -> dict[str, Any]:
    row = result.to_json()
    row.pop("object")
    amount = row.pop("amount", None)
    money = {"amount_value": amount["value"], "currency": amount["currency"]} if amount else {}
    day = datetime.fromtimestamp(bucket.start_time, tz=UTC).date().isoformat()
    return {"date": day, "start_time": bucket.start_time, "end_time": bucket.end_time, **money, **row}
