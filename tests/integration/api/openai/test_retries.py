"""Retry what failed keeping what succeeded, and results while a batch runs (Backfill extensions), through the
official openai SDK's generic `client.post` and plain HTTP, with the in-process worker on the fake engine."""

from __future__ import annotations

import json
import time
from typing import Any

import httpx
import openai
import pytest

from tests.conftest import LiveServer, make_key
from tests.integration.api.conftest import FAKE_MODELS
from tests.integration.api.helpers import chat_line, read_lines, to_jsonl, upload, wait_for

pytestmark = pytest.mark.backfill_env({"BACKFILL_MODELS": FAKE_MODELS})


def retry(client: openai.OpenAI, batch_id: str, **body: Any) -> openai.types.Batch:
    return client.post(f"/batches/{batch_id}/retry", body=body, cast_to=openai.types.Batch)


def get_results(client: openai.OpenAI, batch_id: str, **params: str) -> tuple[list[dict[str, Any]], httpx.Headers]:
    response = httpx.get(
        f"{client.base_url}batches/{batch_id}/results",
        params=params,
        headers={"Authorization": f"Bearer {client.api_key}"},
        timeout=30,
    )
    assert response.status_code == 200, response.text
    return [json.loads(line) for line in response.text.splitlines()], response.headers


def cancelled_midway(client: openai.OpenAI) -> openai.types.Batch:
    """A batch of 4 quick and 12 two-second requests, cancelled once the quick ones completed."""
    lines = [chat_line(i, max_tokens=2 if i < 4 else 2000) for i in range(16)]
    batch = client.batches.create(
        input_file_id=upload(client, to_jsonl(lines)).id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    while client.batches.retrieve(batch.id).request_counts.completed < 4:
        time.sleep(0.02)
    with pytest.raises(openai.ConflictError, match="only an ended batch"):
        retry(client, batch.id)
    client.batches.cancel(batch.id)
    return wait_for(client, batch.id)


def test_a_retry_of_a_cancelled_batch_reruns_only_its_cancelled_requests_and_keeps_the_successes(
    api: LiveServer,
) -> None:
    client = api.client(make_key("acme"))
    origin = cancelled_midway(client)
    kept = {line["custom_id"] for line in read_lines(client, origin.output_file_id)}
    failed = {line["custom_id"] for line in read_lines(client, origin.error_file_id)}
    assert len(kept) >= 4 and failed and len(kept | failed) == 16

    again = retry(client, origin.id)
    assert again.id != origin.id and again.model_extra and again.model_extra["retry_of"] == origin.id
    assert again.request_counts and again.request_counts.total == len(failed)
    done = wait_for(client, again.id)
    assert done.status == "completed" and done.error_file_id is None
    assert {line["custom_id"] for line in read_lines(client, done.output_file_id)} == failed  # no success re-ran
    assert client.batches.retrieve(origin.id).model_extra["retries"] == [again.id]  # type: ignore[index]

    merged, headers = get_results(client, origin.id, merged="true")
    assert headers["X-Incomplete"] == "false"
    assert sorted(line["custom_id"] for line in merged) == sorted(kept | failed)  # each exactly once
    assert all(line["error"] is None and line["response"]["status_code"] == 200 for line in merged)
    with pytest.raises(openai.BadRequestError, match="No request"):
        retry(client, origin.id)  # everything succeeded by now: nothing is run twice


def test_client_errors_rerun_only_when_named_and_the_merged_view_of_two_retries_takes_the_latest(
    api: LiveServer,
) -> None:
    client = api.client(make_key("acme"))
    lines = [chat_line(i) for i in range(3)] + [chat_line(3, max_tokens=2, min_tokens=5)]  # line 4: a 400
    origin = wait_for(
        client,
        client.batches.create(
            input_file_id=upload(client, to_jsonl(lines)).id,
            endpoint="/v1/chat/completions",
            completion_window="24h",
        ).id,
    )
    assert origin.status == "completed" and origin.request_counts.failed == 1  # type: ignore[union-attr]
    [bad] = read_lines(client, origin.error_file_id)
    with pytest.raises(openai.BadRequestError) as refused:
        retry(client, origin.id)  # a client error is not retried unless named
    assert refused.value.code == "nothing_to_retry"

    first = wait_for(client, retry(client, origin.id, codes=[bad["error"]["code"]]).id)
    second = wait_for(client, retry(client, origin.id, codes=[bad["error"]["code"]]).id)
    assert (first.request_counts.total, second.request_counts.total) == (1, 1)  # type: ignore[union-attr]
    assert second.model_extra["retry_of"] == origin.id  # type: ignore[index]
    assert client.batches.retrieve(origin.id).model_extra["retries"] == [first.id, second.id]  # type: ignore[index]

    merged, _ = get_results(client, origin.id, merged="true")
    assert [line["custom_id"] for line in merged] == ["req-0", "req-1", "req-2", "req-3"]
    [latest] = read_lines(client, second.error_file_id)
    assert merged[3] == latest and latest["id"] != bad["id"]  # the second retry's attempt wins


def test_results_stream_while_the_batch_runs_and_the_cursor_returns_only_new_lines(api: LiveServer) -> None:
    client = api.client(make_key("acme"))
    lines = [chat_line(i, max_tokens=2 if i < 5 else 10**8) for i in range(9)]
    batch = client.batches.create(
        input_file_id=upload(client, to_jsonl(lines)).id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    while client.batches.retrieve(batch.id).request_counts.completed < 5:
        time.sleep(0.02)
    early, headers = get_results(client, batch.id)
    assert headers["X-Incomplete"] == "true" and len(early) == 5
    assert all(line["response"]["status_code"] == 200 for line in early)
    nothing, same = get_results(client, batch.id, after=headers["X-Next-After"])
    assert nothing == [] and same["X-Next-After"] == headers["X-Next-After"]

    client.batches.cancel(batch.id)
    wait_for(client, batch.id)
    rest, last = get_results(client, batch.id, after=headers["X-Next-After"])
    assert last["X-Incomplete"] == "false" and len(rest) == 4
    assert all(line["error"]["code"] == "batch_cancelled" for line in rest)
    assert sorted(line["custom_id"] for line in early + rest) == sorted(f"req-{i}" for i in range(9))
    whole, _ = get_results(client, batch.id)
    assert sorted(line["custom_id"] for line in whole) == sorted(f"req-{i}" for i in range(9))

    from storage.queue.result_rows import numbered_pages

    pages = list(numbered_pages(batch_id=batch.id, after=0, upto=9, page_rows=2))  # what the route streams
    assert [len(page) for page in pages] == [2, 2, 2, 2, 1]
    with pytest.raises(openai.BadRequestError):
        client.get(f"/batches/{batch.id}/results", options={"params": {"after": "line 3"}}, cast_to=httpx.Response)


def test_another_tenants_uploads_and_batches_go_on_while_one_tenant_retries_a_chain_to_its_limit(
    api: LiveServer,
) -> None:
    """Tenant A cancels and retries a 500-line batch down to the retry limit (10), then asks for more retries and
    merged views; tenant B uploads and runs batches all the while, untouched: every upload answered, every batch
    done with each line run once (a reaper that took the live worker for dead would have re-run them)."""
    import threading

    from sqlalchemy import select

    from storage.db import transaction
    from storage.models import BatchRequest

    a, b = api.client(make_key("tenant-a")), api.client(make_key("tenant-b"))
    lines = [chat_line(i, max_tokens=10**8) for i in range(500)]  # never finish: each attempt is cancelled
    origin = a.batches.create(
        input_file_id=upload(a, to_jsonl(lines)).id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    wait_for(a, origin.id, statuses={"in_progress"})
    stop, done = threading.Event(), []

    def tenant_b() -> None:
        while not stop.is_set():
            source = upload(b, to_jsonl([chat_line(i) for i in range(20)]))
            batch = b.batches.create(input_file_id=source.id, endpoint="/v1/chat/completions", completion_window="24h")
            done.append(wait_for(b, batch.id))

    other = threading.Thread(target=tenant_b, daemon=True)
    other.start()
    try:
        latest = origin.id
        for _ in range(10):
            a.batches.cancel(latest)
            wait_for(a, latest)
            latest = retry(a, latest).id
        a.batches.cancel(latest)
        wait_for(a, latest)
        for batch_id in (latest, origin.id):
            with pytest.raises(openai.ConflictError, match="already holds 10 retries") as refused:
                retry(a, batch_id)
            assert refused.value.code == "retry_limit_reached"
            assert len(get_results(a, batch_id, merged="true")[0]) == 500
        while len(done) < 2:
            time.sleep(0.1)
    finally:
        stop.set()
        other.join(timeout=120)
    assert all(batch.status == "completed" and batch.request_counts.completed == 20 for batch in done)
    with transaction() as session:
        query = select(BatchRequest.attempts).where(BatchRequest.batch_id.in_([batch.id for batch in done]))
        assert set(session.scalars(query).all()) == {1}
