"""Cost and finance endpoints over HTTP: tenant scoping, admin visibility, CSV, group_by, errors."""

from __future__ import annotations

import csv
import io
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import httpx
import pytest

from storage import lifecycle
from storage.db import transaction
from tests.conftest import Backend, LiveServer, make_key, start_server
from tests.factories import DAY, DAY0, make_batch, make_request, make_run, make_tenant

pytestmark = pytest.mark.backfill_env({"BACKFILL_MODELS": '{"fake-model": {"path": "fake:"}}'})


@pytest.fixture
def server(backend: Backend) -> Iterator[LiveServer]:
    server, stop = start_server(with_worker=False)
    yield server
    stop()


@pytest.fixture
def seeded() -> dict[str, Any]:
    """acme has two jobs and globex one, all finished on DAY0 in one run; globex has one more on DAY0 + 1."""
    with transaction() as session:
        acme, globex = make_tenant(session, "acme"), make_tenant(session, "globex")
        run = make_run(session, busy_seconds=90.0)
        jobs = {
            "acme": make_batch(session, tenant=acme),
            "acme_week": make_batch(session, tenant=acme, completion_window="24h"),
            "globex": make_batch(session, tenant=globex),
        }
        for job in jobs.values():
            for _ in range(4):
                make_request(session, batch=job, run=run, prompt_tokens=500, completion_tokens=1000)
        make_request(session, batch=jobs["acme"], status=lifecycle.REQ_FAILED)
        pending = make_batch(session, tenant=acme)
        make_request(session, batch=pending, status=lifecycle.REQ_QUEUED)
        later = make_run(session, busy_seconds=10.0)
        make_request(session, batch=jobs["globex"], run=later, completion_tokens=100, finished_at=DAY0 + DAY + 60)
        ids = {name: job.id for name, job in jobs.items()} | {"pending": pending.id}
        return {"ids": ids, "acme": acme.id, "globex": globex.id, "run": run.id}


def get(server: LiveServer, key: str, path: str, **params: Any) -> httpx.Response:
    return httpx.get(f"{server.base_url}{path}", params=params, headers={"Authorization": f"Bearer {key}"})


def report(server: LiveServer, key: str, **params: Any) -> httpx.Response:
    return get(server, key, "/v1/organization/costs", start_time=DAY0, end_time=DAY0 + 2 * DAY, **params)


def test_a_job_cost_is_its_list_price_less_discount_and_its_share_of_the_run(
    server: LiveServer, seeded: dict[str, Any]
) -> None:
    response = get(server, make_key("acme"), f"/v1/batches/{seeded['ids']['acme']}/cost")

    assert response.status_code == 200
    body = response.json()
    assert (body["object"], body["batch_id"], body["currency"]) == ("batch.cost", seeded["ids"]["acme"], "usd")
    cost = body["cost"]
    assert (cost["input_tokens"], cost["output_tokens"]) == (2000, 4000)  # the failed request is not billed
    assert Decimal(cost["gpu_seconds"]) == Decimal("240.000")  # a third of 90 busy seconds x 8 GPUs
    assert Decimal(cost["billed_usd"]) == Decimal(cost["list_usd"]) - Decimal(cost["discount_usd"])
    assert cost["discount_pct"] == "50.00"


def test_a_job_with_nothing_completed_has_a_null_cost(server: LiveServer, seeded: dict[str, Any]) -> None:
    response = get(server, make_key("acme"), f"/v1/batches/{seeded['ids']['pending']}/cost")

    assert response.status_code == 200 and response.json()["cost"] is None


def test_another_tenants_job_cost_is_404_exactly_like_a_missing_one(server: LiveServer, seeded: dict[str, Any]) -> None:
    key = make_key("globex")
    foreign_id = seeded["ids"]["acme"]

    foreign = get(server, key, f"/v1/batches/{foreign_id}/cost")
    missing = get(server, key, "/v1/batches/batch_doesnotexist/cost")

    assert foreign.status_code == missing.status_code == 404
    assert foreign.json()["error"]["message"].replace(foreign_id, "X") == missing.json()["error"]["message"].replace(
        "batch_doesnotexist", "X"
    )
    assert foreign.json()["error"]["code"] == missing.json()["error"]["code"] == "batch_not_found"


def test_an_admin_sees_every_tenant_and_a_tenant_only_itself(server: LiveServer, seeded: dict[str, Any]) -> None:
    admin = report(server, make_key("ops", admin=True), group_by="tenant").json()
    tenant = report(server, make_key("acme"), group_by="tenant").json()

    assert admin["object"] == "page" and admin["has_more"] is False and admin["next_page"] is None
    assert [b["start_time"] for b in admin["data"]] == [DAY0, DAY0 + DAY]
    assert {r["tenant_id"] for r in admin["data"][0]["results"]} == {seeded["acme"], seeded["globex"]}
    assert [r["tenant_id"] for b in tenant["data"] for r in b["results"]] == [seeded["acme"]]
    assert tenant["data"][0]["results"][0]["num_model_requests"] == 8


def test_admin_can_filter_one_tenant_but_a_tenant_cannot_read_another(
    server: LiveServer, seeded: dict[str, Any]
) -> None:
    admin = report(server, make_key("ops", admin=True), tenant_id=seeded["globex"]).json()
    refused = report(server, make_key("acme"), tenant_id=seeded["globex"])

    assert [r["num_model_requests"] for b in admin["data"] for r in b["results"]] == [4, 1]
    assert refused.status_code == 403 and refused.json()["error"]["param"] == "tenant_id"


def test_a_days_cost_row_adds_up_to_the_runs_measured_cost(server: LiveServer, seeded: dict[str, Any]) -> None:
    key = make_key("ops", admin=True)
    day = report(server, key).json()["data"][0]["results"][0]
    acme = [
        get(server, make_key("acme"), f"/v1/batches/{seeded['ids'][n]}/cost").json()["cost"]
        for n in ("acme", "acme_week")
    ]
    globex = get(server, make_key("globex"), f"/v1/batches/{seeded['ids']['globex']}/cost").json()["cost"]

    run_usd = Decimal(90) * 8 * Decimal("3.99") / 3600
    jobs_usd = sum(Decimal(c["compute_usd"]) for c in acme)
    assert abs(Decimal(day["compute_usd"]) - run_usd) <= run_usd / 100
    assert day["amount"] == {"value": day["billed_usd"], "currency": "usd"}
    # globex's job also used the second run, on the next day: its DAY0 part is the first run's third.
    assert abs(jobs_usd + run_usd / 3 - Decimal(day["compute_usd"])) <= run_usd / 100
    assert Decimal(globex["compute_usd"]) > run_usd / 3


def test_group_by_is_repeatable_or_comma_separated(server: LiveServer, seeded: dict[str, Any]) -> None:
    key = make_key("ops", admin=True)
    repeated = report(server, key, group_by=["model", "completion_window"]).json()
    commas = report(server, key, group_by="model,completion_window").json()

    assert repeated == commas
    result = repeated["data"][0]["results"][0]
    assert (result["model"], result["completion_window"]) == ("fake-model", "24h") and "tenant_id" not in result


def test_csv_download_has_the_same_rows_as_json(server: LiveServer, seeded: dict[str, Any]) -> None:
    key = make_key("ops", admin=True)
    page = report(server, key, group_by="tenant").json()
    response = report(server, key, group_by="tenant", format="csv")

    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/csv")
    assert "attachment" in response.headers["content-disposition"]
    rows = list(csv.DictReader(io.StringIO(response.text)))
    expected = [(b["start_time"], r["tenant_id"], r["billed_usd"]) for b in page["data"] for r in b["results"]]
    assert [(int(r["start_time"]), r["tenant_id"], r["billed_usd"]) for r in rows] == expected


def test_usage_counts_tokens_and_requests_per_day(server: LiveServer, seeded: dict[str, Any]) -> None:
    response = get(
        server, make_key("acme"), "/v1/organization/usage", start_time=DAY0, end_time=DAY0 + DAY, group_by="tenant"
    )

    result = response.json()["data"][0]["results"][0]
    assert (result["input_tokens"], result["output_tokens"]) == (4000, 8000)
    assert (result["num_model_requests"], result["num_failed_requests"]) == (8, 1)


@pytest.mark.parametrize(
    ("params", "param"),
    [
        ({"start_time": DAY0, "bucket_width": "1h"}, "bucket_width"),
        ({"start_time": DAY0, "group_by": "project"}, "group_by"),
        ({"start_time": DAY0, "format": "xml"}, "format"),
        ({"start_time": DAY0, "end_time": DAY0}, "end_time"),
        ({}, "start_time"),
    ],
)
def test_bad_report_queries_are_400_with_the_openai_envelope(
    server: LiveServer, params: dict[str, Any], param: str
) -> None:
    response = get(server, make_key("ops", admin=True), "/v1/organization/costs", **params)

    assert response.status_code == 400
    assert set(response.json()["error"]) == {"message", "type", "param", "code"}
    assert response.json()["error"]["param"] == param


def test_reports_and_planner_need_a_key_but_the_finance_page_does_not(server: LiveServer) -> None:
    assert httpx.get(f"{server.base_url}/v1/organization/costs", params={"start_time": DAY0}).status_code == 401
    assert httpx.get(f"{server.base_url}/v1/planner").status_code == 401
    page = httpx.get(f"{server.base_url}/finance")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert 'id="chart-daily"' in page.text


def test_planner_defaults_to_the_worked_example_on_this_node(server: LiveServer) -> None:
    key = make_key("ops")
    plan = get(server, key, "/v1/planner", batch_sizes="1,384").json()

    assert plan["knee_batch_size"] == 53 and plan["hardware"]["usd_per_hour"] == "31.92"
    one, many = (Decimal(r["usd_per_mtok"]) for r in plan["rows"])
    assert one.quantize(Decimal("0.01")) == Decimal("23.80") and Decimal("0.49") < many < Decimal("0.52")
    assert plan["prefill"]["prompt_tokens_per_s"] == pytest.approx(56_062, abs=1)  # the other clock
    assert get(server, key, "/v1/planner", batch_sizes="0").json()["error"]["param"] == "batch_sizes"


def test_the_finance_page_keeps_the_key_for_the_tab_only_and_cannot_be_framed_or_injected(server: LiveServer) -> None:
    import base64
    import hashlib
    import re

    page = httpx.get(f"{server.base_url}/finance")
    assert "localStorage" not in page.text and "sessionStorage" in page.text  # gone when the tab closes
    directives = (part.strip().partition(" ") for part in page.headers["content-security-policy"].split(";"))
    policy = {name: value for name, _, value in directives}
    assert policy["frame-ancestors"] == "'none'" and policy["default-src"] == "'none'"
    assert policy["connect-src"] == "'self'" and policy["base-uri"] == "'none'"
    assert "unsafe-inline" not in page.headers["content-security-policy"]
    for tag in ("script", "style"):  # only the page's own inline blocks run, by hash
        blocks = re.findall(rf"<{tag}>(.*?)</{tag}>", page.text, flags=re.S)
        assert blocks
        for block in blocks:
            digest = base64.b64encode(hashlib.sha256(block.encode()).digest()).decode()
            assert f"'sha256-{digest}'" in policy[f"{tag}-src"].split()
    assert " style=" not in page.text  # style attributes would need 'unsafe-inline'
    assert page.headers["x-content-type-options"] == "nosniff"
    assert page.headers["referrer-policy"] == "no-referrer"
    assert page.headers["x-frame-options"] == "DENY"
