"""A price for every deadline (issue 40 §3): the estimate's menu of windows, each with admission's finish and verdict."""

from __future__ import annotations

import json
from decimal import Decimal

import pytest
from sqlalchemy.orm import Session

from storage import lifecycle
from storage.batches.estimates import estimate_job
from storage.planning.shapes import JobShape
from storage.settings import Settings
from tests.factories import DAY0, make_batch, make_request, make_run, make_tenant

WINDOWS = {"4h": "0.4", "1h": "0.2", "background": "0.6", "24h": "0.5"}
pytestmark = pytest.mark.backfill_env(
    {"BACKFILL_COMPLETION_WINDOWS": json.dumps(WINDOWS), "BACKFILL_ADMISSION_POLICY": "reject"}
)
JOB = JobShape(requests=10, input_tokens=0, output_tokens=10_000, model="fake-model")  # 10 s at 1,000 tokens/s


def due_in(session: Session, seconds: int, *, output_tokens: int, tenant: str = "globex") -> None:
    """An accepted job of the model, due `seconds` after DAY0, asking for `output_tokens` (in 100,000-token lines)."""
    batch = make_batch(session, tenant=make_tenant(session, tenant), created_at=DAY0 + seconds - 86_400)
    for _ in range(output_tokens // 100_000):
        make_request(session, batch=batch, status=lifecycle.REQ_QUEUED, max_tokens=100_000)


def menu(session: Session, settings: Settings, *, tenant_id: str | None = None) -> dict[str, dict[str, object]]:
    estimate = estimate_job(session, model="fake-model", shape=JOB, settings=settings, at=DAY0, tenant_id=tenant_id)
    return {option["completion_window"]: option for option in estimate.to_json()["windows"]}


def test_every_offered_window_is_on_the_menu_shortest_first_background_last_at_its_discount(
    session: Session, settings: Settings
) -> None:
    make_run(session, busy_seconds=10.0, completion_tokens=10_000)  # measured: 1,000 tokens/s

    options = menu(session, settings)

    assert list(options) == ["1h", "4h", "24h", "background"]
    assert options["1h"]["deadline_at"] == DAY0 + 3600 and options["24h"]["deadline_at"] == DAY0 + 86_400
    assert options["background"]["deadline_at"] is None  # no deadline, as the batch object shows none
    for window, discount in WINDOWS.items():
        price = options[window]["price"]
        assert Decimal(price["billed_usd"]) == Decimal(price["list_usd"]) * (1 - Decimal(discount))  # type: ignore[index]
        assert price["discount_pct"] == f"{Decimal(discount) * 100:.2f}"  # type: ignore[index]
    assert all(option["admitted"] and option["reason"] is None for option in options.values())
    assert {option["finish_at"] for option in options.values()} == {DAY0 + 10}  # an empty queue: at once


def test_a_full_backlog_refuses_the_1h_window_and_a_shorter_window_finishes_sooner(
    session: Session, settings: Settings
) -> None:
    make_run(session, busy_seconds=10.0, completion_tokens=10_000)
    due_in(session, 1800, output_tokens=4_000_000)  # 4,000 s of work due in 30 min: served before any menu window
    due_in(session, 12 * 3600, output_tokens=2_000_000)  # 2,000 s due in 12 h: after a 4h job, before a 24h one

    options = menu(session, settings)

    assert options["1h"]["admitted"] is False and options["1h"]["fits_window"] is False
    reason = options["1h"]["reason"]
    assert reason["code"] == "deadline_infeasible" and "would not be enqueued" in reason["message"]  # type: ignore[index]
    assert options["1h"]["finish_at"] == options["4h"]["finish_at"] == DAY0 + 4010
    assert options["4h"]["admitted"] is True and options["4h"]["reason"] is None
    assert options["24h"]["finish_at"] == DAY0 + 6010 and options["24h"]["admitted"] is True
    assert options["background"]["finish_at"] == DAY0 + 6010 and options["background"]["admitted"] is True


@pytest.mark.backfill_env({"BACKFILL_COMPLETION_WINDOWS": json.dumps(WINDOWS), "BACKFILL_ADMISSION_POLICY": "warn"})
def test_under_the_warn_policy_a_late_window_is_admitted_with_its_risk(session: Session, settings: Settings) -> None:
    make_run(session, busy_seconds=10.0, completion_tokens=10_000)
    due_in(session, 1800, output_tokens=4_000_000)

    late = menu(session, settings)["1h"]

    assert late["admitted"] is True and late["fits_window"] is False and late["reason"] is None
    assert late["warning"]["code"] == "deadline_at_risk"  # type: ignore[index]


@pytest.mark.backfill_env(
    {"BACKFILL_COMPLETION_WINDOWS": json.dumps(WINDOWS), "BACKFILL_ENQUEUED_TOKEN_LIMITS": json.dumps({"acme": 100})}
)
def test_a_tenant_over_its_enqueued_token_limit_is_refused_on_every_window(
    session: Session, settings: Settings
) -> None:
    acme = make_tenant(session, "acme")
    due_in(session, 86_400, output_tokens=100_000, tenant="acme")  # its line's input is already enqueued

    big = JobShape(requests=10, input_tokens=1_000, output_tokens=10_000, model="fake-model")
    estimate = estimate_job(session, model="fake-model", shape=big, settings=settings, at=DAY0, tenant_id=acme.id)

    assert [option.admitted for option in estimate.windows] == [False] * 4
    assert {option.problem["code"] for option in estimate.windows if option.problem} == {"token_limit_exceeded"}
    other = estimate_job(session, model="fake-model", shape=big, settings=settings, at=DAY0)  # no tenant, no quota
    assert all(option.admitted for option in other.windows)
