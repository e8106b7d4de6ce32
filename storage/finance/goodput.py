"""Goodput: requests completed before their deadline ÷ requests accepted, per batch and per day.

A request is accepted once its batch passed validation and admission (it has a queue row). It counts as
good if it completed (2xx) with `finished_at <= deadline`. Failed, expired and cancelled requests, and
those completed late, are accepted but not good; requests still open are reported apart, so a day whose
deadlines have not all passed yet shows how much is still undecided. Reports put a request on the UTC day
of its deadline (its batch's `expires_at`): once that day is over, its figures no longer change. Background
batches (no deadline) are left out of every goodput figure.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import ColumnElement, case, func, select
from sqlalchemy.orm import Session

from storage import lifecycle
from storage.finance.reports import DAY_SECONDS, GROUP_FIELDS, Bucket, check_window, day_buckets, sorted_groups
from storage.models import Batch, BatchRequest
from storage.windows import BACKGROUND_WINDOW

_GROUP_COLUMNS = {
    "tenant": BatchRequest.tenant_id,
    "model": BatchRequest.model,
    "completion_window": Batch.completion_window,
    "protocol": Batch.protocol,
}
_STATUS_FIELD = {
    lifecycle.REQ_FAILED: "failed",
    lifecycle.REQ_EXPIRED: "expired",
    lifecycle.REQ_CANCELLED: "cancelled",
    lifecycle.REQ_QUEUED: "open",
    lifecycle.REQ_RUNNING: "open",
}


@dataclass
class GoodputResult:
    """Accepted requests of one group and what became of them."""

    group: dict[str, str | None] = field(default_factory=dict)
    accepted: int = 0
    completed_on_time: int = 0
    completed_late: int = 0
    failed: int = 0
    expired: int = 0
    cancelled: int = 0
    open: int = 0

    @property
    def goodput(self) -> float | None:
        """completed_on_time / accepted (None with nothing accepted)."""
        return self.completed_on_time / self.accepted if self.accepted else None

    def add(self, status: str, on_time: bool, count: int) -> None:
        """Count `count` requests that ended in `status` (on time or not)."""
        self.accepted += count
        if status == lifecycle.REQ_COMPLETED:
            name = "completed_on_time" if on_time else "completed_late"
        else:
            name = _STATUS_FIELD[status]
        setattr(self, name, getattr(self, name) + count)

    def to_json(self, *, object_name: str = "organization.goodput.result") -> dict[str, Any]:
        """The counts and the ratio (rounded to 4 places), with the group's fields."""
        ratio = self.goodput
        return {
            "object": object_name,
            "accepted": self.accepted,
            "completed_on_time": self.completed_on_time,
            "completed_late": self.completed_late,
            "failed": self.failed,
            "expired": self.expired,
            "cancelled": self.cancelled,
            "open": self.open,
            "goodput": None if ratio is None else round(ratio, 4),
            **self.group,
        }


def _on_time() -> Any:
    return case((BatchRequest.finished_at <= BatchRequest.deadline, 1), else_=0)


def _with_deadline() -> ColumnElement[bool]:
    """Background batches have no deadline, so goodput (done before the deadline) does not apply to them."""
    return Batch.completion_window != BACKGROUND_WINDOW


def batch_goodput(session: Session, *, batch_id: str) -> GoodputResult | None:
    """The batch's goodput so far, or None if nothing was accepted (still validating, or refused)."""
    on_time = _on_time()
    rows = session.execute(
        select(BatchRequest.status, on_time, func.count())
        .join(Batch, Batch.id == BatchRequest.batch_id)
        .where(BatchRequest.batch_id == batch_id, _with_deadline())
        .group_by(BatchRequest.status, on_time)
    ).all()
    if not rows:
        return None
    result = GoodputResult()
    for status, good, count in rows:
        result.add(status, bool(good), int(count))
    return result


def goodput_report(
    session: Session,
    *,
    start_time: int,
    end_time: int,
    tenant_id: str | None = None,
    group_by: Sequence[str] = (),
) -> list[Bucket]:
    """Per-UTC-day goodput of requests whose deadline falls in [start_time, end_time), grouped as asked."""
    check_window(start_time=start_time, end_time=end_time)
    keys = [_GROUP_COLUMNS[name] for name in group_by]
    on_time = _on_time()
    query = (
        select(Batch.expires_at, BatchRequest.status, on_time, *keys, func.count())
        .join(Batch, Batch.id == BatchRequest.batch_id)
        .where(Batch.expires_at >= start_time, Batch.expires_at < end_time, _with_deadline())
        .group_by(Batch.expires_at, BatchRequest.status, on_time, *keys)
    )
    if tenant_id is not None:
        query = query.where(Batch.tenant_id == tenant_id)
    table: dict[int, dict[tuple[str | None, ...], GoodputResult]] = defaultdict(dict)
    for deadline, status, good, *rest in session.execute(query):
        values, count = rest[:-1], int(rest[-1])
        group = {GROUP_FIELDS[name]: value for name, value in zip(group_by, values, strict=True)}
        result = table[int(deadline) // DAY_SECONDS].setdefault(tuple(group.values()), GoodputResult(group))
        result.add(status, bool(good), count)
    return day_buckets(start_time, end_time, {day: sorted_groups(results) for day, results in table.items()})


def goodput_by_model(session: Session, *, deadline_from: int, deadline_to: int) -> dict[str, GoodputResult]:
    """Goodput per model of the requests whose deadline fell in [deadline_from, deadline_to) (metrics)."""
    on_time = _on_time()
    rows = session.execute(
        select(BatchRequest.model, BatchRequest.status, on_time, func.count())
        .join(Batch, Batch.id == BatchRequest.batch_id)
        .where(Batch.expires_at >= deadline_from, Batch.expires_at < deadline_to, _with_deadline())
        .group_by(BatchRequest.model, BatchRequest.status, on_time)
    ).all()
    results: dict[str, GoodputResult] = {}
    for model, status, good, count in rows:
        results.setdefault(model, GoodputResult({"model": model})).add(status, bool(good), int(count))
    return results
