"""Goodput counts per batch and per deadline day, on SQLite and Postgres."""

from __future__ import annotations

import pytest
from sqlalchemy.orm import Session

from storage import lifecycle
from storage.finance.goodput import batch_goodput, goodput_report
from storage.models import Batch
from tests.factories import DAY, DAY0, make_batch, make_request, make_tenant


def fill(session: Session, batch: Batch, **outcomes: int) -> None:
    """Requests of `batch` by outcome: on_time, late, failed, expired, cancelled, queued."""
    deadline = batch.expires_at
    for _ in range(outcomes.get("on_time", 0)):
        make_request(session, batch=batch, finished_at=deadline - 60)
    for _ in range(outcomes.get("late", 0)):
        make_request(session, batch=batch, finished_at=deadline + 60)
    for status in ("failed", "expired", "cancelled", "queued"):
        for _ in range(outcomes.get(status, 0)):
            make_request(session, batch=batch, status=status, finished_at=deadline - 1)


def test_a_batchs_goodput_is_on_time_completions_over_accepted_requests(session: Session) -> None:
    batch = make_batch(session, tenant=make_tenant(session))
    fill(session, batch, on_time=6, late=1, failed=1, expired=1, queued=1)

    result = batch_goodput(session, batch_id=batch.id)

    assert result is not None and result.goodput == pytest.approx(0.6)
    body = result.to_json(object_name="batch.goodput")
    assert body == {
        "object": "batch.goodput",
        "accepted": 10,
        "completed_on_time": 6,
        "completed_late": 1,
        "failed": 1,
        "expired": 1,
        "cancelled": 0,
        "open": 1,
        "goodput": 0.6,
    }


def test_a_batch_with_nothing_accepted_has_no_goodput(session: Session) -> None:
    batch = make_batch(session, tenant=make_tenant(session), status=lifecycle.FAILED)

    assert batch_goodput(session, batch_id=batch.id) is None


def test_the_report_puts_requests_on_their_deadline_day_per_tenant(session: Session) -> None:
    acme, globex = make_tenant(session, "acme"), make_tenant(session, "globex")
    fill(session, make_batch(session, tenant=acme), on_time=3, late=1)  # deadline on DAY0 + 1 day
    fill(session, make_batch(session, tenant=globex), on_time=1, expired=1)
    fill(session, make_batch(session, tenant=acme, created_at=DAY0 + DAY), on_time=2)  # deadline on day 2

    buckets = goodput_report(session, start_time=DAY0, end_time=DAY0 + 3 * DAY, group_by=["tenant"])
    only_acme = goodput_report(session, start_time=DAY0, end_time=DAY0 + 3 * DAY, tenant_id=acme.id)

    assert [b.start_time for b in buckets] == [DAY0, DAY0 + DAY, DAY0 + 2 * DAY]
    assert buckets[0].results == []
    day1 = {r.group["tenant_id"]: (r.accepted, r.completed_on_time, r.goodput) for r in buckets[1].results}
    assert day1 == {acme.id: (4, 3, 0.75), globex.id: (2, 1, 0.5)}
    assert [(r.accepted, r.goodput) for r in buckets[2].results] == [(2, 1.0)]
    assert [[(r.accepted, r.completed_late) for r in b.results] for b in only_acme] == [[], [(4, 1)], [(2, 0)]]
    assert buckets[1].to_json()["results"][0]["object"] == "organization.goodput.result"
