"""GET /metrics on the API: a real batch moves the counters and the queue gauges; scrapes are cheap and bounded."""

from __future__ import annotations

import threading
from decimal import Decimal

import httpx
import pytest
import sqlalchemy as sa

from storage.db import get_engine, transaction
from storage.metrics.queue_state import QUEUE_STATE
from tests.conftest import LiveServer, make_key
from tests.integration.api.conftest import FAKE_MODELS
from tests.integration.api.helpers import chat_line, read_lines, to_jsonl, upload, wait_for
from tests.observability import named_metrics
from tests.scrape import scrape, total, value

ENV = {"BACKFILL_MODELS": FAKE_MODELS, "BACKFILL_METRICS_CACHE_SECONDS": "0"}
pytestmark = pytest.mark.backfill_env(ENV)


def test_a_finished_batch_shows_on_metrics_with_its_requests_tokens_cost_and_engine_time(api: LiveServer) -> None:
    before, _ = scrape(f"{api.base_url}/metrics")
    client = api.client(make_key("acme"))
    lines = [chat_line(i, max_tokens=3) for i in range(12)] + [b"{not json"]
    bad = client.batches.create(
        input_file_id=upload(client, to_jsonl(lines[:12]) + b"{not json\n").id,
        endpoint="/v1/chat/completions",
        completion_window="24h",
    )
    batch = client.batches.create(
        input_file_id=upload(client, to_jsonl(lines[:12])).id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    done = wait_for(client, batch.id)
    assert done.status == "completed" and wait_for(client, bad.id).status == "failed"
    output_tokens = sum(
        line["response"]["body"]["usage"]["completion_tokens"] for line in read_lines(client, done.output_file_id)
    )
    after, families = scrape(f"{api.base_url}/metrics")

    def grew(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    model = {"model": "fake-model"}
    assert value(after, "backfill_requests_finished_total", tenant="acme", outcome="completed", **model) == 12
    assert value(after, "backfill_batches", status="completed", **model) == 1
    assert value(after, "backfill_batches", status="failed", **model) == 1
    assert total(after, "backfill_queue_requests") == 0
    assert grew("backfill_engine_results_total", outcome="completed", **model) == 12
    assert grew("backfill_engine_output_tokens_total", **model) == output_tokens > 0
    assert grew("backfill_engine_prompt_tokens_total", **model) > 0
    assert grew("backfill_engine_steps_total", **model) >= 3
    assert grew("backfill_engine_busy_seconds_total", **model) > 0
    assert grew("backfill_requests_claimed_total", **model) == 12
    assert grew("backfill_result_latency_seconds_count", **model) == 12
    assert grew("backfill_ingest_lines_total", outcome="enqueued") == 12
    assert grew("backfill_ingest_rejected_lines_total", code="invalid_json") == 1
    assert grew("backfill_finalize_seconds_count", status="completed") == 1
    billed = Decimal(client.batches.retrieve(batch.id).model_extra["cost"]["billed_usd"])
    assert grew("backfill_batch_cost_usd_total", kind="billed", **model) == pytest.approx(float(billed), abs=1e-6)
    assert value(after, "backfill_engine_max_num_seqs", **model) == 8
    assert value(after, "backfill_queue_state_up") == 1
    assert {"backfill_s3_errors", "backfill_database_errors", "backfill_webhook_deliveries"} <= families
    assert value(after, "backfill_goodput_ratio", **model) == 1.0
    assert value(after, "backfill_goodput_requests", result="completed_on_time", **model) == 12
    # Everything the dashboard and the alert rules name is on this live /metrics (API + embedded worker):
    # as samples, or as a declared family with nothing to report now (no open work: no earliest deadline).
    exposed = {name for name, _ in after} | families
    assert named_metrics() - {"up"} <= exposed, sorted(named_metrics() - {"up"} - exposed)


def test_tenants_past_the_label_limit_share_one_series(api: LiveServer, monkeypatch: pytest.MonkeyPatch) -> None:
    from storage.settings import get_settings

    monkeypatch.setattr(get_settings(), "metrics_tenants_max", 1)
    for tenant in ("first", "second", "third"):
        client = api.client(make_key(tenant))
        source = upload(client, to_jsonl([chat_line(i) for i in range(2)]))
        batch = client.batches.create(input_file_id=source.id, endpoint="/v1/chat/completions", completion_window="24h")
        wait_for(client, batch.id)
    samples, _ = scrape(f"{api.base_url}/metrics")
    tenants = {dict(labels)["tenant"] for name, labels in samples if name == "backfill_requests_finished_total"}
    assert tenants == {"first", "_other"}
    assert (
        value(samples, "backfill_requests_finished_total", model="fake-model", tenant="_other", outcome="completed")
        == 4
    )


@pytest.mark.backfill_env({**ENV, "BACKFILL_METRICS_TOKEN": "scrape-secret"})
def test_a_metrics_token_keeps_unauthenticated_scrapers_out(api: LiveServer) -> None:
    refused = httpx.get(f"{api.base_url}/metrics")
    assert refused.status_code == 401 and refused.json()["error"]["code"] == "invalid_api_key"
    assert httpx.get(f"{api.base_url}/metrics", headers={"Authorization": "Bearer wrong"}).status_code == 401
    samples, _ = scrape(f"{api.base_url}/metrics", token="scrape-secret")
    assert value(samples, "backfill_queue_state_up") == 1


@pytest.mark.backfill_env({**ENV, "BACKFILL_METRICS_CACHE_SECONDS": "30"})
def test_a_scrape_storm_reads_the_database_once_per_cache_interval(
    api: LiveServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    from storage.metrics import queue_state

    QUEUE_STATE.clear()
    statements: list[str] = []
    reads: list[int] = []
    reading = threading.local()
    original = queue_state.read_snapshot

    def counted_read(*args, **kwargs):  # type: ignore[no-untyped-def]
        reads.append(1)
        reading.active = True
        try:
            return original(*args, **kwargs)
        finally:
            reading.active = False

    def seen(conn, cursor, statement, *args) -> None:  # type: ignore[no-untyped-def]
        # Only the scrapes' reads count: the embedded worker, its deliverer and heartbeats read on their own.
        if getattr(reading, "active", False):
            statements.append(statement)

    monkeypatch.setattr(queue_state, "read_snapshot", counted_read)
    scrape(f"{api.base_url}/metrics")  # one read, counted as the baseline
    per_read = 0
    sa.event.listen(get_engine(), "before_cursor_execute", seen)
    try:
        QUEUE_STATE.clear()
        scrape(f"{api.base_url}/metrics")
        per_read = len(statements)
        statements.clear()
        reads.clear()
        QUEUE_STATE.clear()  # the cache is empty when the storm begins: every scrape wants a read
        threads = [threading.Thread(target=scrape, args=(f"{api.base_url}/metrics",)) for _ in range(20)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        sa.event.remove(get_engine(), "before_cursor_execute", seen)
    assert per_read > 0
    # 20 concurrent scrapes, one read: the others wait for it and reuse it. At most one read's statements (a read
    # may find a planner cache of its own still fresh that the baseline read refilled: fewer, never more).
    assert len(reads) == 1 and 0 < len(statements) <= per_read


def test_a_failing_statement_counts_as_a_database_error(api: LiveServer) -> None:
    before, _ = scrape(f"{api.base_url}/metrics")
    with pytest.raises(sa.exc.DBAPIError), transaction() as session:
        session.execute(sa.text("SELECT * FROM no_such_table"))
    after, _ = scrape(f"{api.base_url}/metrics")
    assert total(after, "backfill_database_errors_total") - total(before, "backfill_database_errors_total") == 1


def test_a_missing_object_counts_as_an_s3_error(api: LiveServer, backend) -> None:  # type: ignore[no-untyped-def]
    from storage.files.blobs import get_blob_store

    if backend.name != "postgres":
        pytest.skip("S3 errors need S3")
    before, _ = scrape(f"{api.base_url}/metrics")
    with pytest.raises(Exception, match="NoSuchKey"):
        b"".join(get_blob_store().open_stream("acme/files/file-missing.jsonl"))
    after, _ = scrape(f"{api.base_url}/metrics")
    assert (
        value(after, "backfill_s3_errors_total", operation="get")
        - value(before, "backfill_s3_errors_total", operation="get")
        == 1
    )
