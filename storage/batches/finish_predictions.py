"""Predictions checked against what happened: a batch's predicted finish (admission's, kept at ingest:
`Batch.predicted_finish_at`) against its actual end, as a metric when it ends and per window for the console.

The actual finish is the stamp of the end state: `completed_at`, or `expired_at` for a batch whose deadline
passed first (then the error is a lower bound: the work was not done even then). A cancelled or failed batch is
not compared: it did not run to its end. A paused batch's pause is in its error: the prediction assumed none.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from storage import lifecycle
from storage.metrics import events
from storage.models import Batch
from storage.windows import by_length

_ENDED_AT = {lifecycle.COMPLETED: Batch.completed_at, lifecycle.EXPIRED: Batch.expired_at}
RECENT_BATCHES = 500  # the console's chart: the most recent ended batches with a prediction


def finish_error(batch: Batch) -> float | None:
    """Seconds the ended batch finished after its predicted finish (negative: before); None if not compared."""
    ended = {lifecycle.COMPLETED: batch.completed_at, lifecycle.EXPIRED: batch.expired_at}.get(batch.status)
    if ended is None or batch.predicted_finish_at is None:
        return None
    return float(ended - batch.predicted_finish_at)


def observe_finish(batch: Batch) -> None:
    """Count an ended batch's finish error in `backfill_batch_finish_error_seconds` (if it had a prediction)."""
    error = finish_error(batch)
    if error is not None:
        events.observe_finish_error(window=batch.completion_window, outcome=batch.status, seconds=error)


@dataclass(frozen=True)
class WindowErrors:
    """How a window's predictions fared over recent ended batches (seconds: actual minus predicted)."""

    window: str
    batches: int
    expired: int
    median_seconds: float
    worst_seconds: float  # the latest finish against its prediction

    def to_json(self) -> dict[str, Any]:
        """JSON-ready: seconds rounded to whole seconds."""
        return {
            "completion_window": self.window,
            "batches": self.batches,
            "expired": self.expired,
            "median_error_seconds": round(self.median_seconds),
            "worst_error_seconds": round(self.worst_seconds),
        }


def finish_errors(session: Session, *, since: int, limit: int = RECENT_BATCHES) -> list[WindowErrors]:
    """Per completion window (shortest first, background last): the finish errors of the batches of every tenant
    that ended since `since` with a prediction (the most recent `limit` completed and `limit` expired)."""
    by_window: dict[str, list[tuple[str, float]]] = {}
    for status, column in _ENDED_AT.items():
        rows = session.execute(
            select(Batch.completion_window, column, Batch.predicted_finish_at)
            .where(Batch.status == status, Batch.predicted_finish_at.is_not(None), column >= since)
            .order_by(column.desc())
            .limit(limit)
        )
        for window, ended, predicted in rows:
            by_window.setdefault(window, []).append((status, float((ended or 0) - (predicted or 0))))
    return [
        WindowErrors(
            window=window,
            batches=len(by_window[window]),
            expired=sum(status == lifecycle.EXPIRED for status, _ in by_window[window]),
            median_seconds=statistics.median(error for _, error in by_window[window]),
            worst_seconds=max(error for _, error in by_window[window]),
        )
        for window in by_length(by_window)
    ]
