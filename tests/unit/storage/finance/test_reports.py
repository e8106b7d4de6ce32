"""Daily finance reports: a day's row equals its jobs' cost blocks and its runs' measured cost."""

from __future__ import annotations

import csv
import io
import json
from decimal import Decimal

import pytest
from sqlalchemy.orm import Session

from storage import lifecycle
from storage.errors import InvalidRequest
from storage.finance.job_cost import batch_cost, run_costs
from storage.finance.reports import cost_report, page_json, parse_group_by, to_csv, usage_report
from storage.settings import Settings
from tests.factories import DAY, DAY0, make_batch, make_request, make_run, make_tenant

pytestmark = pytest.mark.backfill_env(
    {
        "BACKFILL_PRICE_BOOK": json.dumps(
            {
                "prices": [
                    {
                        "model": "fake-model",
                        "effective_from": "2026-01-01",
                        "input_usd_per_mtok": "1",
                        "output_usd_per_mtok": "4",
                    },
                    {
                        "model": "other-model",
                        "effective_from": "2026-01-01",
                        "input_usd_per_mtok": "2",
                        "output_usd_per_mtok": "8",
                    },
                ]
            }
        ),
        "BACKFILL_COMPLETION_WINDOWS": '{"24h": "0.5", "7d": "0.75"}',
    }
)


def one_day(session: Session) -> dict[str, object]:
    """Two runs, three tenants' jobs, all finished on DAY0, plus noise on the next day."""
    acme, globex = make_tenant(session, "acme"), make_tenant(session, "globex")
    jobs = [
        make_batch(session, tenant=acme),
        make_batch(session, tenant=acme, model="other-model", completion_window="7d"),
        make_batch(session, tenant=globex),
    ]
    runs = [
        make_run(session, busy_seconds=123.456),
        make_run(session, busy_seconds=7.5, steps=10, running_seq_steps=40),
    ]
    for index in range(30):
        make_request(
            session,
            batch=jobs[index % 3],
            run=runs[index % 2],
            prompt_tokens=100 + 13 * index,
            completion_tokens=50 + 7 * index,
            finished_at=DAY0 + 3600 + index * 60,
        )
    make_request(session, batch=jobs[0], status=lifecycle.REQ_FAILED, finished_at=DAY0 + 100)
    late = make_batch(session, tenant=globex)
    make_request(
        session, batch=late, run=make_run(session, busy_seconds=5.0), completion_tokens=10, finished_at=DAY0 + DAY
    )
    return {"jobs": jobs, "runs": runs}


def test_a_days_row_equals_its_jobs_cost_blocks_and_its_runs_measured_cost(
    session: Session, settings: Settings
) -> None:
    data = one_day(session)
    blocks = [batch_cost(session, batch=job, settings=settings) for job in data["jobs"]]  # type: ignore[attr-defined]
    runs = [run_costs(session, run.id, settings=settings) for run in data["runs"]]  # type: ignore[attr-defined]

    buckets = cost_report(session, settings=settings, start_time=DAY0, end_time=DAY0 + DAY)

    assert len(buckets) == 1 and len(buckets[0].results) == 1
    row = buckets[0].results[0]
    jobs_compute = sum((b.compute_usd for b in blocks if b), Decimal(0))
    jobs_billed = sum((b.billed_usd for b in blocks if b), Decimal(0))
    runs_compute = sum((r.compute_usd for r in runs if r), Decimal(0))
    assert abs(row.compute_usd - jobs_compute) <= jobs_compute / 100
    assert abs(row.compute_usd - runs_compute) <= runs_compute / 100
    assert abs(row.billed_usd - jobs_billed) <= jobs_billed / 100
    assert abs(row.compute_usd - runs_compute) < Decimal("1e-18")  # in fact exact to Decimal precision
    assert row.billed_usd == jobs_billed
    assert row.num_model_requests == 30
    assert row.margin_usd == row.billed_usd - row.compute_usd


def test_report_groups_by_tenant_model_and_window(session: Session, settings: Settings) -> None:
    one_day(session)

    buckets = cost_report(
        session, settings=settings, start_time=DAY0, end_time=DAY0 + 2 * DAY, group_by=parse_group_by(["tenant,model"])
    )

    assert [b.start_time for b in buckets] == [DAY0, DAY0 + DAY]
    first = [r.to_json() for r in buckets[0].results]
    assert sorted((r["model"], r["num_model_requests"]) for r in first) == [
        ("fake-model", 10),
        ("fake-model", 10),
        ("other-model", 10),
    ]
    assert len({r["tenant_id"] for r in first}) == 2
    assert all("completion_window" not in r for r in first)
    assert [r.num_model_requests for r in buckets[1].results] == [1]


def test_a_tenant_filter_sees_only_that_tenants_rows(session: Session, settings: Settings) -> None:
    one_day(session)
    globex = make_tenant(session, "globex")

    buckets = cost_report(session, settings=settings, start_time=DAY0, end_time=DAY0 + DAY, tenant_id=globex.id)

    assert [r.num_model_requests for r in buckets[0].results] == [10]


def test_empty_days_are_buckets_with_no_results(session: Session, settings: Settings) -> None:
    buckets = cost_report(session, settings=settings, start_time=DAY0, end_time=DAY0 + 3 * DAY)

    assert page_json(buckets) == {
        "object": "page",
        "data": [
            {"object": "bucket", "start_time": DAY0 + d * DAY, "end_time": DAY0 + (d + 1) * DAY, "results": []}
            for d in range(3)
        ],
        "has_more": False,
        "next_page": None,
    }


def test_usage_counts_tokens_of_completed_and_failures_separately(session: Session) -> None:
    one_day(session)

    buckets = usage_report(session, start_time=DAY0, end_time=DAY0 + DAY, group_by=["completion_window"])

    rows = {r.group["completion_window"]: r for r in buckets[0].results}
    assert rows["24h"].num_model_requests == 20 and rows["24h"].num_failed_requests == 1
    assert rows["7d"].num_model_requests == 10 and rows["7d"].num_failed_requests == 0
    assert rows["7d"].to_json()["object"] == "organization.usage.result"


def test_csv_has_a_header_and_one_line_per_day_and_group(session: Session, settings: Settings) -> None:
    one_day(session)
    group_by = parse_group_by(["model"])

    text = to_csv(
        cost_report(session, settings=settings, start_time=DAY0, end_time=DAY0 + DAY, group_by=group_by),
        kind="costs",
        group_by=group_by,
    )

    rows = list(csv.DictReader(io.StringIO(text)))
    assert [(r["date"], r["model"]) for r in rows] == [("2026-03-02", "fake-model"), ("2026-03-02", "other-model")]
    assert rows[0]["currency"] == "usd" and Decimal(rows[0]["amount_value"]) == Decimal(rows[0]["billed_usd"])
    assert to_csv([], kind="usage").startswith("date,start_time,end_time,input_tokens")


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [
        ({"group_by": ["tenant", "project"]}, "group_by"),
        ({"end_time": DAY0}, "end_time"),
        ({"end_time": DAY0 + 400 * DAY}, "end_time"),
    ],
)
def test_bad_report_windows_and_groups_are_rejected(
    session: Session, settings: Settings, kwargs: dict[str, object], param: str
) -> None:
    args: dict[str, object] = {"start_time": DAY0, "end_time": DAY0 + DAY, **kwargs}
    with pytest.raises(InvalidRequest) as error:
        args["group_by"] = parse_group_by(args.get("group_by"))  # type: ignore[arg-type]
        cost_report(session, settings=settings, **args)  # type: ignore[arg-type]
    assert error.value.param == param


def test_a_job_spanning_two_days_splits_its_run_exactly_and_a_day_never_depends_on_the_window(
    session: Session, settings: Settings
) -> None:
    job = make_batch(session, tenant=make_tenant(session, "acme"))
    run = make_run(session, busy_seconds=10.0)
    for index in range(6):  # three requests finish each day, the second day's twice as long
        make_request(
            session,
            batch=job,
            run=run,
            prompt_tokens=100,
            completion_tokens=50 if index < 3 else 100,
            finished_at=DAY0 + 84_000 + index * 1_000,
        )
    both = cost_report(session, settings=settings, start_time=DAY0, end_time=DAY0 + 2 * DAY)
    first_only = cost_report(session, settings=settings, start_time=DAY0, end_time=DAY0 + DAY)
    second_only = cost_report(session, settings=settings, start_time=DAY0 + DAY, end_time=DAY0 + 2 * DAY)

    day1, day2 = (bucket.results[0] for bucket in both)
    assert first_only[0].results[0].compute_usd == day1.compute_usd  # the window asked for changes nothing
    assert second_only[0].results[0].compute_usd == day2.compute_usd
    block = batch_cost(session, batch=job, settings=settings)
    assert block is not None and day1.gpu_seconds + day2.gpu_seconds == block.gpu_seconds  # to the last digit
    # work = output + 0.2 x input: day 1 3 x (50 + 20) = 210, day 2 3 x (100 + 20) = 360
    assert float(day1.gpu_seconds / block.gpu_seconds) == pytest.approx(210 / 570, rel=1e-9)
