"""Predicted against actual finish (issue 40 §3): which ended batches are compared, and the console's figures."""

from __future__ import annotations

import json

import pytest
from prometheus_client import REGISTRY
from sqlalchemy.orm import Session

from storage import lifecycle
from storage.batches.finish_predictions import finish_error, finish_errors, observe_finish
from tests.factories import DAY0, make_batch, make_tenant

pytestmark = pytest.mark.backfill_env({"BACKFILL_COMPLETION_WINDOWS": json.dumps({"1h": "0.2", "background": "0.6"})})


def ended(session: Session, window: str, status: str, *, predicted: int | None, ended_at: int) -> None:
    batch = make_batch(session, tenant=make_tenant(session), completion_window=window, status=status)
    batch.predicted_finish_at = predicted
    setattr(batch, f"{status}_at", ended_at)
    session.flush()


def test_a_completed_or_expired_batch_is_compared_and_a_cancelled_one_or_one_without_a_prediction_is_not(
    session: Session,
) -> None:
    tenant = make_tenant(session)
    batch = make_batch(session, tenant=tenant, completion_window="1h", status=lifecycle.COMPLETED)
    batch.predicted_finish_at, batch.completed_at = DAY0 + 100, DAY0 + 160
    labels = {"window": "1h", "outcome": "completed"}
    before = REGISTRY.get_sample_value("backfill_batch_finish_error_seconds_count", labels) or 0

    observe_finish(batch)

    assert finish_error(batch) == 60.0
    assert REGISTRY.get_sample_value("backfill_batch_finish_error_seconds_count", labels) == before + 1
    batch.status, batch.cancelled_at = lifecycle.CANCELLED, DAY0 + 200
    assert finish_error(batch) is None  # it did not run to its end
    batch.status, batch.predicted_finish_at = lifecycle.COMPLETED, None
    assert finish_error(batch) is None  # nothing was predicted (before 0025, or a retry)


def test_the_console_gets_each_windows_median_and_worst_error_shortest_window_first(session: Session) -> None:
    ended(session, "background", lifecycle.COMPLETED, predicted=DAY0, ended_at=DAY0 - 30)
    ended(session, "1h", lifecycle.COMPLETED, predicted=DAY0, ended_at=DAY0 + 10)
    ended(session, "1h", lifecycle.COMPLETED, predicted=DAY0, ended_at=DAY0 + 20)
    ended(session, "1h", lifecycle.EXPIRED, predicted=DAY0, ended_at=DAY0 + 3600)
    ended(session, "1h", lifecycle.COMPLETED, predicted=None, ended_at=DAY0 + 9999)  # not compared
    ended(session, "1h", lifecycle.COMPLETED, predicted=DAY0 - 86_400, ended_at=DAY0 - 86_000)  # before `since`

    rows = [row.to_json() for row in finish_errors(session, since=DAY0 - 3600)]

    assert rows == [
        {
            "completion_window": "1h",
            "batches": 3,
            "expired": 1,
            "median_error_seconds": 20,
            "worst_error_seconds": 3600,
        },
        {
            "completion_window": "background",
            "batches": 1,
            "expired": 0,
            "median_error_seconds": -30,
            "worst_error_seconds": -30,
        },
    ]
