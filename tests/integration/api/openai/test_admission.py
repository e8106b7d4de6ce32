"""Admission, quotas and goodput as the official openai SDK (and a plain HTTP client) sees them."""

from __future__ import annotations

import httpx
import pytest

from storage.clock import now
from storage.db import transaction
from tests.conftest import LiveServer, make_key
from tests.factories import make_run
from tests.integration.api.conftest import FAKE_MODELS
from tests.integration.api.helpers import chat_line, to_jsonl, upload, wait_for

pytestmark = pytest.mark.backfill_env({"BACKFILL_MODELS": FAKE_MODELS})


@pytest.mark.backfill_env({"BACKFILL_MODELS": FAKE_MODELS, "BACKFILL_ENQUEUED_TOKEN_LIMITS": '{"acme": 100}'})
def test_a_batch_over_the_tenants_enqueued_token_limit_fails_with_openais_code(api: LiveServer) -> None:
    client = api.client(make_key("acme"))
    source = upload(client, to_jsonl([chat_line(i) for i in range(20)]))  # ~20 x 35 estimated input tokens

    batch = wait_for(
        client,
        client.batches.create(input_file_id=source.id, endpoint="/v1/chat/completions", completion_window="24h").id,
    )

    assert batch.status == "failed" and batch.request_counts.total == 0
    assert batch.errors is not None and len(batch.errors.data) == 1
    error = batch.errors.data[0]
    assert error.code == "token_limit_exceeded" and error.line is None
    assert error.message is not None and "Limit: 100 enqueued tokens" in error.message
    other = api.client(make_key("globex"))  # no limit for other tenants
    done = wait_for(
        other,
        other.batches.create(
            input_file_id=upload(other, to_jsonl([chat_line(0)])).id,
            endpoint="/v1/chat/completions",
            completion_window="24h",
        ).id,
    )
    assert done.status == "completed"


def test_an_at_risk_batch_carries_a_warning_and_reports_its_goodput(api: LiveServer) -> None:
    with transaction() as session:
        make_run(session, busy_seconds=1000.0, completion_tokens=10)  # 0.01 tokens/s: nothing fits a day
    client = api.client(make_key("acme"))
    source = upload(client, to_jsonl([chat_line(i, max_tokens=100) for i in range(10)]))

    created = client.batches.create(input_file_id=source.id, endpoint="/v1/chat/completions", completion_window="24h")
    done = wait_for(client, created.id)

    assert done.status == "completed" and done.errors is None  # warn: accepted, and here it ran at once
    warnings = done.warnings  # an extra field: the SDK keeps it as plain JSON
    assert warnings["object"] == "list" and [w["code"] for w in warnings["data"]] == ["deadline_at_risk"]
    assert done.goodput == {
        "object": "batch.goodput",
        "accepted": 10,
        "completed_on_time": 10,
        "completed_late": 0,
        "failed": 0,
        "expired": 0,
        "cancelled": 0,
        "open": 0,
        "goodput": 1.0,
    }
    listed = next(b for b in client.batches.list() if b.id == created.id)
    assert listed.warnings == warnings


def test_goodput_report_shows_tenants_only_their_own_jobs(api: LiveServer) -> None:
    keys = {name: make_key(name) for name in ("acme", "globex")}
    admin = make_key("ops", admin=True)
    for name, key in keys.items():
        client = api.client(key)
        source = upload(client, to_jsonl([chat_line(i) for i in range(3 if name == "acme" else 2)]))
        wait_for(
            client,
            client.batches.create(input_file_id=source.id, endpoint="/v1/chat/completions", completion_window="24h").id,
        )

    def report(key: str, **params: str) -> httpx.Response:
        window = {"start_time": str(now() - 86400), "end_time": str(now() + 2 * 86400)}  # deadlines are a day out
        query = {**window, "group_by": "tenant", **params}
        return httpx.get(
            f"{api.base_url}/v1/organization/goodput", params=query, headers={"Authorization": f"Bearer {key}"}
        )

    everyone = [r for b in report(admin).json()["data"] for r in b["results"]]
    mine = [r for b in report(keys["acme"]).json()["data"] for r in b["results"]]

    assert sorted(r["accepted"] for r in everyone) == [2, 3] and all(r["goodput"] == 1.0 for r in everyone)
    assert [r["accepted"] for r in mine] == [3]
    other = everyone[0]["tenant_id"] if everyone[0]["accepted"] == 2 else everyone[1]["tenant_id"]
    assert report(keys["acme"], tenant_id=other).status_code == 403
