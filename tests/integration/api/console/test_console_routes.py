"""The console's server side: the page's headers and policy, no key in URLs, tenant scoping, admin-only views."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from storage import lifecycle
from storage.clock import now
from storage.db import transaction
from storage.finance.budgets import month_start
from storage.models import Batch
from storage.protocols import ANTHROPIC
from storage.windows import BACKGROUND_DEADLINE
from tests.conftest import Backend, LiveServer, make_key, start_server
from tests.factories import DAY0, make_batch, make_request, make_tenant

pytestmark = pytest.mark.backfill_env({"BACKFILL_MODELS": '{"fake-model": {"path": "fake:"}}'})


@pytest.fixture
def server(backend: Backend) -> Iterator[LiveServer]:
    server, stop = start_server(with_worker=False)
    yield server
    stop()


def get(server: LiveServer, key: str | None, path: str, **params: Any) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.get(f"{server.base_url}{path}", params=params, headers=headers)


@pytest.fixture
def seeded() -> dict[str, str]:
    """acme: an OpenAI batch tagged nightly (two lines failed with one code, one with another, one done), an
    Anthropic batch and a cancelled one; globex: one batch of its own."""
    with transaction() as session:
        acme, globex = make_tenant(session, "acme"), make_tenant(session, "globex")
        nightly = make_batch(session, tenant=acme, created_at=DAY0 + 30)
        nightly.metadata_ = {"project": "nightly-eval"}
        make_request(session, batch=nightly)
        for code in ("invalid_request", "context_length_exceeded", "invalid_request"):
            failed = make_request(session, batch=nightly, status=lifecycle.REQ_FAILED, finished_at=DAY0 + 60)
            failed.error_code, failed.error_message = code, f"{code} on {failed.custom_id}"
        nightly.request_total, nightly.request_completed, nightly.request_failed = 4, 1, 3
        messages = make_batch(session, tenant=acme, created_at=DAY0 + 20)
        messages.protocol = ANTHROPIC.name
        cancelled = make_batch(session, tenant=acme, created_at=DAY0 + 10, status=lifecycle.CANCELLED)
        theirs = make_batch(session, tenant=globex, created_at=DAY0 + 40)
        session.flush()
        return {"nightly": nightly.id, "messages": messages.id, "cancelled": cancelled.id, "theirs": theirs.id}


@pytest.mark.parametrize("backend", ["embedded"], indirect=True)
def test_console_page_sends_a_strict_policy_and_loads_nothing_from_elsewhere(server: LiveServer) -> None:
    response = httpx.get(f"{server.base_url}/console")
    assert response.status_code == 200
    policy = response.headers["content-security-policy"]
    assert "default-src 'none'" in policy and "frame-ancestors 'none'" in policy and "connect-src 'self'" in policy
    assert "unsafe-inline" not in policy and "unsafe-eval" not in policy
    assert response.headers["x-content-type-options"] == "nosniff"
    assert response.headers["x-frame-options"] == "DENY"
    assert response.headers["referrer-policy"] == "no-referrer"
    assert response.headers["cache-control"] == "no-store"
    assert "set-cookie" not in response.headers
    page = response.text
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", page), "an asset from another origin"
    assert "localStorage" not in page and "document.cookie" not in page  # the key lives in sessionStorage only
    assert not re.search(r"[?&](api_)?key=", page), "the page never puts a key in a URL"


@pytest.mark.parametrize("backend", ["embedded"], indirect=True)
def test_a_key_in_the_console_url_is_refused_and_not_echoed(server: LiveServer) -> None:
    for name in ("key", "api_key", "KEY"):
        response = httpx.get(f"{server.base_url}/console", params={name: "sk-bf-leaked-secret"})
        assert response.status_code == 400
        assert "sk-bf-leaked-secret" not in response.text


@pytest.mark.parametrize("backend", ["embedded", "postgres"], indirect=True)
def test_batch_list_shows_both_protocols_of_my_tenant_only_with_filters_search_and_pages(
    server: LiveServer, seeded: dict[str, str]
) -> None:
    key = make_key("acme")
    listed = get(server, key, "/v1/console/batches").json()
    assert [row["id"] for row in listed["data"]] == [seeded["nightly"], seeded["messages"], seeded["cancelled"]]
    assert {row["protocol"] for row in listed["data"]} == {"openai", "anthropic"}
    nightly = listed["data"][0]
    assert nightly["request_counts"] == {"total": 4, "completed": 1, "failed": 3}
    assert nightly["cost"]["discount_pct"] == "50.00"
    # The console reaches each batch where its protocol's API serves it, and streams results where it has a route.
    paths = {row["id"]: (row["path"], row["results_path"], row["endpoint_label"]) for row in listed["data"]}
    assert paths[seeded["nightly"]] == (f"/v1/batches/{seeded['nightly']}", None, "/v1/chat/completions")
    messages = seeded["messages"]
    assert paths[messages] == (
        f"/v1/messages/batches/{messages}",
        f"/v1/messages/batches/{messages}/results",
        "messages",
    )
    # Every batch's lines a page at a time through the one paged results route, a message batch's in its own format.
    for row in listed["data"]:
        assert row["lines_path"] == f"/v1/batches/{row['id']}/results"
    lines = {row["id"]: row["lines_path"] for row in listed["data"]}
    page = get(server, key, lines[messages], limit=1)
    assert page.status_code == 200 and page.headers["X-Next-After"].startswith("rs_")

    cancelled = get(server, key, "/v1/console/batches", status="cancelled").json()["data"]
    assert [row["id"] for row in cancelled] == [seeded["cancelled"]]
    found = get(server, key, "/v1/console/batches", q="NIGHTLY").json()["data"]
    assert [row["id"] for row in found] == [seeded["nightly"]]
    assert [row["id"] for row in get(server, key, "/v1/console/batches", q=seeded["messages"][-8:]).json()["data"]] == [
        seeded["messages"]
    ]
    assert get(server, key, "/v1/console/batches", q="100%_").json()["data"] == []  # wildcards are literal

    first = get(server, key, "/v1/console/batches", limit=2).json()
    assert first["has_more"] and len(first["data"]) == 2
    rest = get(server, key, "/v1/console/batches", limit=2, after=first["last_id"]).json()
    assert [row["id"] for row in rest["data"]] == [seeded["cancelled"]] and not rest["has_more"]

    assert get(server, key, "/v1/console/batches", q=seeded["theirs"]).json()["data"] == []
    assert get(server, key, "/v1/console/batches", status="nonsense").status_code == 400


@pytest.mark.parametrize("backend", ["embedded", "postgres"], indirect=True)
def test_a_batch_shows_its_failed_lines_grouped_by_code_with_line_numbers(
    server: LiveServer, seeded: dict[str, str]
) -> None:
    detail = get(server, make_key("acme"), f"/v1/console/batches/{seeded['nightly']}").json()
    groups = {group["code"]: group for group in detail["failures"]}
    assert [group["code"] for group in detail["failures"]] == ["invalid_request", "context_length_exceeded"]
    assert groups["invalid_request"]["count"] == 2
    assert [line["line"] for line in groups["invalid_request"]["lines"]] == [2, 4]
    assert groups["invalid_request"]["lines"][0] == {"line": 2, "custom_id": "r2", "message": "invalid_request on r2"}
    assert groups["context_length_exceeded"]["lines"][0]["line"] == 3
    assert get(server, make_key("globex"), f"/v1/console/batches/{seeded['nightly']}").status_code == 404


@pytest.mark.parametrize("backend", ["embedded"], indirect=True)
def test_operator_overview_answers_admin_keys_only(server: LiveServer, seeded: dict[str, str]) -> None:
    refused = get(server, make_key("acme"), "/v1/console/overview")
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "permission_denied"
    assert get(server, None, "/v1/console/overview").status_code == 401
    overview = get(server, make_key("ops", admin=True), "/v1/console/overview").json()
    assert overview["object"] == "console.overview" and overview["ok"]
    # engine busy seconds are process-wide counters: an earlier test's engine may be listed too
    served = {model["model"]: model for model in overview["models"]}
    assert "fake-model" in served and "at_risk" in served["fake-model"]


@pytest.mark.parametrize("backend", ["embedded"], indirect=True)
def test_whoami_tells_admin_keys_apart_and_lists_what_a_batch_may_ask_for(server: LiveServer) -> None:
    tenant = get(server, make_key("acme"), "/v1/console/whoami").json()
    assert tenant["is_admin"] is False and tenant["completion_windows"] == {"24h": "0.5", "background": "0.6"}
    assert "/v1/chat/completions" in tenant["endpoints"]
    assert get(server, make_key("ops", admin=True), "/v1/console/whoami").json()["is_admin"] is True
    assert get(server, "sk-bf-wrong", "/v1/console/whoami").status_code == 401


@pytest.mark.parametrize("backend", ["embedded", "postgres"], indirect=True)
def test_a_batch_shows_what_its_controls_set_pause_priority_spend_cap_and_retries(
    server: LiveServer, seeded: dict[str, str]
) -> None:
    with transaction() as session:
        nightly = session.get(Batch, seeded["nightly"])
        assert nightly is not None
        nightly.priority, nightly.paused_at, nightly.max_cost_micro_usd = 7, DAY0 + 90, 2_500_000
        retry = make_batch(session, tenant=make_tenant(session, "acme"), created_at=DAY0 + 50)
        retry.retry_of = seeded["cancelled"]
        retry_id = retry.id
    key = make_key("acme")
    detail = get(server, key, f"/v1/console/batches/{seeded['nightly']}").json()
    assert (detail["priority"], detail["paused_at"], detail["max_cost_usd"]) == (7, DAY0 + 90, "2.500000")
    listed = {row["id"]: row for row in get(server, key, "/v1/console/batches").json()["data"]}
    assert listed[seeded["nightly"]]["paused_at"] == DAY0 + 90 and listed[retry_id]["retry_of"] == seeded["cancelled"]
    assert get(server, key, f"/v1/console/batches/{seeded['cancelled']}").json()["retries"] == [retry_id]
    assert listed[seeded["messages"]]["max_cost_usd"] is None


def test_a_batch_shows_its_trial_with_its_report_its_checks_and_what_expiry_does(
    server: LiveServer, seeded: dict[str, str]
) -> None:
    report = {"lines_run": 2, "succeeded": 1, "success_rate": 0.5, "errors": {"checks_failed": 1}, "decision": "paused"}
    with transaction() as session:
        nightly = session.get(Batch, seeded["nightly"])
        assert nightly is not None
        nightly.trial = {"lines": 2, "continue": "manual", "min_success_rate": 0.95, "report": report}
        nightly.trial_status, nightly.on_expiry = "reported", "continue_in_background"
        nightly.checks = {"schema": True, "max_attempts": 2, "regex": "yes|no"}
    key = make_key("acme")
    detail = get(server, key, f"/v1/console/batches/{seeded['nightly']}").json()
    assert detail["trial"] == {
        "lines": 2,
        "continue": "manual",
        "min_success_rate": 0.95,
        "status": "reported",
        "report": report,
    }
    assert detail["checks"] == {"schema": True, "max_attempts": 2, "regex": "yes|no"}
    assert detail["on_expiry"] == "continue_in_background"
    plain = get(server, key, f"/v1/console/batches/{seeded['messages']}").json()
    assert (plain["trial"], plain["checks"], plain["on_expiry"]) == (None, None, None)


PRICED = {
    "BACKFILL_MODELS": '{"fake-model": {"path": "fake:"}}',
    # one output token bills exactly $1 in the 24h window (list $2, 50% off); input is free
    "BACKFILL_PRICE_BOOK": '{"prices": [{"model": "fake-model", "effective_from": "2025-01-01", '
    '"input_usd_per_mtok": "0", "output_usd_per_mtok": "2000000"}]}',
}


@pytest.mark.backfill_env(PRICED)
@pytest.mark.parametrize("backend", ["embedded", "postgres"], indirect=True)
def test_admins_see_each_tenants_budget_against_this_months_spend_and_tenants_may_not(server: LiveServer) -> None:
    today = now()
    with transaction() as session:
        acme, globex = make_tenant(session, "acme"), make_tenant(session, "globex")
        make_tenant(session, "idle")  # neither budget nor spend: not listed
        acme.monthly_budget_micro_usd = 10_000_000
        for tenant, tokens, finished in ((acme, 3, today), (globex, 2, today), (globex, 5, month_start(today) - 60)):
            batch = make_batch(session, tenant=tenant, created_at=month_start(today) - 3600)
            make_request(session, batch=batch, completion_tokens=tokens, finished_at=finished)
    refused = get(server, make_key("acme"), "/v1/console/budgets")
    assert refused.status_code == 403
    rows = {
        row["tenant"]: row for row in get(server, make_key("ops", admin=True), "/v1/console/budgets").json()["data"]
    }
    assert set(rows) == {"acme", "globex"}
    assert (rows["acme"]["monthly_budget_usd"], rows["acme"]["spent_usd"], rows["acme"]["remaining_usd"]) == (
        "10.000000",
        "3.000000",
        "7.000000",
    )
    assert (rows["globex"]["monthly_budget_usd"], rows["globex"]["spent_usd"]) == (
        None,
        "2.000000",
    )  # last month's $5 not
    own = get(server, make_key("acme"), "/v1/organization/budgets").json()
    assert own["spent_usd"] == rows["acme"]["spent_usd"]  # the admin's view and the tenant's agree


@pytest.mark.parametrize("backend", ["embedded", "postgres"], indirect=True)
def test_a_background_batch_has_no_time_left_to_show(server: LiveServer) -> None:
    with transaction() as session:
        batch = make_batch(session, tenant=make_tenant(session, "acme"), completion_window="background")
        batch.expires_at = BACKGROUND_DEADLINE  # what create stores: the reaper never expires it
        batch_id = batch.id
    key = make_key("acme")
    assert get(server, key, f"/v1/console/batches/{batch_id}").json()["expires_at"] is None
    assert get(server, key, "/v1/console/batches").json()["data"][0]["expires_at"] is None
    assert get(server, key, f"/v1/batches/{batch_id}").json()["expires_at"] is None  # as the public API says


@pytest.mark.parametrize("backend", ["embedded", "postgres"], indirect=True)
def test_an_admin_key_lists_every_tenants_batches_with_their_tenant_and_tenants_still_see_only_theirs(
    server: LiveServer, seeded: dict[str, str]
) -> None:
    admin = make_key("ops", admin=True)
    listed = get(server, admin, "/v1/console/batches").json()
    tenants = {row["id"]: row["tenant"] for row in listed["data"]}
    assert tenants == {
        seeded["theirs"]: "globex",
        seeded["nightly"]: "acme",
        seeded["messages"]: "acme",
        seeded["cancelled"]: "acme",
    }
    first = get(server, admin, "/v1/console/batches", limit=2).json()
    rest = get(server, admin, "/v1/console/batches", limit=2, after=first["last_id"]).json()
    assert [row["id"] for row in first["data"] + rest["data"]] == [row["id"] for row in listed["data"]]
    assert [row["id"] for row in get(server, admin, "/v1/console/batches", q="nightly").json()["data"]] == [
        seeded["nightly"]
    ]
    # the list only: every other read stays the key's own tenant's, an admin's too
    assert get(server, admin, f"/v1/console/batches/{seeded['theirs']}").status_code == 404
    assert get(server, admin, f"/v1/batches/{seeded['theirs']}").status_code == 404
    mine = get(server, make_key("acme"), "/v1/console/batches").json()["data"]
    assert {row["id"] for row in mine} == {seeded["nightly"], seeded["messages"], seeded["cancelled"]}
    assert all("tenant" not in row for row in mine)
    assert get(server, make_key("globex"), "/v1/console/batches", q=seeded["nightly"]).json()["data"] == []


@pytest.mark.parametrize("backend", ["embedded", "postgres"], indirect=True)
def test_an_origin_says_how_many_of_its_failed_lines_its_retries_ran_and_fixed(server: LiveServer) -> None:
    """The console offers "Retry failed lines" only when some may still be retried, and says what retries did."""
    with transaction() as session:
        acme = make_tenant(session, "acme")
        origin = make_batch(session, tenant=acme, status=lifecycle.CANCELLED)
        origin.request_total, origin.request_completed, origin.request_failed = 5, 1, 4
        first = make_batch(session, tenant=acme, status=lifecycle.COMPLETED)
        first.retry_of, first.retry_root, first.attempt = origin.id, origin.id, 1
        first.request_total, first.request_completed, first.request_failed = 4, 3, 1
        second = make_batch(session, tenant=acme, status=lifecycle.IN_PROGRESS)  # a retry of the retry, running
        second.retry_of, second.retry_root, second.attempt = first.id, origin.id, 2
        second.request_total = 1
        ids = {"origin": origin.id, "first": first.id, "second": second.id}
    key = make_key("acme")
    detail = get(server, key, f"/v1/console/batches/{ids['origin']}").json()
    assert detail["retried"] == {"running_retry": ids["second"], "succeeded": 3, "failing": 1}
    assert get(server, key, f"/v1/console/batches/{ids['first']}").json()["retried"] == {
        "running_retry": ids["second"],
        "succeeded": 0,
        "failing": 1,
    }
    with transaction() as session:
        done = session.get(Batch, ids["second"])
        assert done is not None
        done.status, done.request_completed = lifecycle.COMPLETED, 1
    assert get(server, key, f"/v1/console/batches/{ids['origin']}").json()["retried"] == {
        "running_retry": None,
        "succeeded": 4,
        "failing": 0,
    }
    never = get(server, key, "/v1/console/batches").json()["data"]
    assert all("retried" not in row for row in never)  # the list stays one query per page
