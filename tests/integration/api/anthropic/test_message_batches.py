"""Anthropic Message Batches through the official `anthropic` SDK, with the in-process worker on the fake engine.

The real engine runs the same flows in tests/e2e/api/anthropic/test_message_batches.py; here the fake engine
makes timing controllable (cancel, expiry, archival) and every error envelope is checked.
"""

from __future__ import annotations

import json
import time
from decimal import Decimal

import anthropic
import pytest

from tests.conftest import LiveServer, make_key
from tests.integration.api.anthropic.batches import (
    ENV,
    assert_envelope,
    client_for,
    counted,
    raw,
    req,
    results,
    stored_manifest,
    wait_ended,
)

pytestmark = pytest.mark.backfill_env(ENV)


def test_a_mixed_model_batch_runs_each_request_on_its_own_model_and_is_priced_per_model(api: LiveServer) -> None:
    key = make_key("acme")
    client = client_for(api, key)
    requests = [req(f"a{i}") for i in range(4)] + [req(f"b{i}", model="other-model", max_tokens=6) for i in range(3)]
    requests += [req("unserved", model="claude-nope"), req("tools", tools=[{"name": "x", "input_schema": {}}])]
    created = client.messages.batches.create(requests=requests)
    assert created.id.startswith("msgbatch_") and created.type == "message_batch"
    assert created.processing_status == "in_progress" and created.results_url is None and created.ended_at is None
    assert created.request_counts.processing == 9 and counted(created) == 9
    assert (created.expires_at - created.created_at).total_seconds() == 24 * 3600

    done = wait_ended(client, created.id)
    assert counted(done) == 9 and (done.request_counts.succeeded, done.request_counts.errored) == (7, 2)
    assert done.ended_at is not None and done.results_url == f"{api.base_url}/v1/messages/batches/{done.id}/results"
    lines = results(client, done.id)
    assert set(lines) == {r["custom_id"] for r in requests}
    for custom_id, result in lines.items():
        if custom_id[0] in "ab":
            assert result.type == "succeeded" and result.message.model == (
                "fake-model" if custom_id[0] == "a" else "other-model"
            )
            assert result.message.id.startswith("msg_") and result.message.content[0].type == "text"
            assert result.message.stop_reason == "max_tokens" and result.message.usage.output_tokens == (
                4 if custom_id[0] == "a" else 6
            )
    assert lines["unserved"].type == "errored" and lines["unserved"].error.error.type == "not_found_error"
    assert "claude-nope" in lines["unserved"].error.error.message
    assert lines["tools"].error.error.type == "invalid_request_error" and "tools" in lines["tools"].error.error.message

    # Each request ran in its own model's engine run; the cost prices each model's tokens at its own list price.
    from sqlalchemy import select

    from storage.db import transaction
    from storage.models import BatchRequest, EngineRun

    with transaction() as session:
        runs = dict(session.execute(select(EngineRun.id, EngineRun.model)).tuples().all())
        rows = session.execute(
            select(
                BatchRequest.custom_id,
                BatchRequest.model,
                BatchRequest.run_id,
                BatchRequest.prompt_tokens,
                BatchRequest.completion_tokens,
            ).where(BatchRequest.batch_id == done.id)
        ).all()
    tokens: dict[str, list[int]] = {"fake-model": [0, 0], "other-model": [0, 0]}
    for custom_id, model, run_id, prompt, completion in rows:
        if custom_id[0] in "ab":
            assert runs[run_id] == model
            tokens[model][0] += prompt
            tokens[model][1] += completion
    listed = (
        tokens["fake-model"][0] * 1
        + tokens["fake-model"][1] * 4
        + tokens["other-model"][0] * 10
        + tokens["other-model"][1] * 40
    )
    cost = client.messages.batches.retrieve(done.id).model_extra["cost"]  # type: ignore[index]
    assert Decimal(cost["list_usd"]) == (Decimal(listed) / 1_000_000).quantize(Decimal("0.000001"))
    assert cost["input_tokens"] == tokens["fake-model"][0] + tokens["other-model"][0]

    # The finance reports carry it, grouped by protocol; OpenAI's API does not see it.
    report = raw(
        api,
        "GET",
        "/v1/organization/costs",
        params={"start_time": int(time.time()) - 3600, "group_by": "protocol,model"},
        headers={"Authorization": f"Bearer {key}"},
    ).json()
    rows_by = {(r["protocol"], r["model"]): r for bucket in report["data"] for r in bucket["results"]}
    assert set(rows_by) == {("anthropic", "fake-model"), ("anthropic", "other-model")}
    assert sum(Decimal(r["list_usd"]) for r in rows_by.values()) == Decimal(cost["list_usd"])
    openai_client = api.client(key)
    assert list(openai_client.batches.list()) == [] and list(openai_client.files.list()) == []
    with pytest.raises(Exception, match="404"):
        openai_client.batches.retrieve(done.id)

    # Deleted: gone from the API, its content scrubbed, its cost still reported.
    deleted = client.messages.batches.delete(done.id)
    assert (deleted.id, deleted.type) == (done.id, "message_batch_deleted")
    with pytest.raises(anthropic.NotFoundError):
        client.messages.batches.retrieve(done.id)
    assert list(client.messages.batches.list()) == []
    with transaction() as session:
        bodies = set(
            json.dumps(b) for b in session.scalars(select(BatchRequest.body).where(BatchRequest.batch_id == done.id))
        )
    assert bodies == {"{}"}
    again = raw(
        api,
        "GET",
        "/v1/organization/costs",
        params={"start_time": int(time.time()) - 3600},
        headers={"Authorization": f"Bearer {key}"},
    ).json()
    assert sum(Decimal(r["list_usd"]) for bucket in again["data"] for r in bucket["results"]) == Decimal(
        cost["list_usd"]
    )


def test_list_pages_newest_first_after_and_before_a_cursor(api: LiveServer) -> None:
    client = client_for(api, make_key("acme"))
    ids = [client.messages.batches.create(requests=[req("only")]).id for _ in range(5)]
    newest_first = list(reversed(ids))
    page = client.messages.batches.list(limit=2)
    assert [b.id for b in page.data] == newest_first[:2] and page.has_more
    assert (page.first_id, page.last_id) == (newest_first[0], newest_first[1])
    assert [b.id for b in client.messages.batches.list(limit=2)] == newest_first  # the SDK follows after_id
    older = client.messages.batches.list(limit=2, after_id=ids[3])
    assert [b.id for b in older.data] == [ids[2], ids[1]] and older.has_more
    newer = client.messages.batches.list(limit=2, before_id=ids[1])
    assert [b.id for b in newer.data] == [ids[3], ids[2]] and newer.has_more
    # Auto-paging with before_id walks towards the newest, page by page (the SDK follows first_id).
    assert [b.id for b in client.messages.batches.list(limit=2, before_id=ids[0])] == [ids[2], ids[1], ids[4], ids[3]]
    assert list(client_for(api, make_key("globex")).messages.batches.list()) == []
    assert_envelope(
        raw(api, "GET", "/v1/messages/batches", params={"limit": 1001}, headers={"x-api-key": make_key("a")}),
        400,
        "invalid_request_error",
        "limit",
    )
    both = raw(
        api,
        "GET",
        "/v1/messages/batches",
        params={"before_id": ids[0], "after_id": ids[1]},
        headers={"x-api-key": make_key("a")},
    )
    assert_envelope(both, 400, "invalid_request_error", "at most one")


def test_cancel_ends_queued_requests_as_canceled_and_delete_waits_for_the_end(api: LiveServer) -> None:
    client = client_for(api, make_key("acme"))
    requests = [req(f"quick{i}", max_tokens=2) for i in range(3)] + [
        req(f"slow{i}", max_tokens=10**8) for i in range(20)
    ]
    batch = client.messages.batches.create(requests=requests)
    while client.messages.batches.retrieve(batch.id).request_counts.succeeded < 3:
        time.sleep(0.05)
    with pytest.raises(anthropic.BadRequestError, match="only ended batches can be deleted"):
        client.messages.batches.delete(batch.id)
    early = raw(api, "GET", f"/v1/messages/batches/{batch.id}/results", headers={"x-api-key": client.api_key})
    assert_envelope(early, 400, "invalid_request_error", "has not ended")  # the SDK itself waits for results_url
    canceling = client.messages.batches.cancel(batch.id)
    assert canceling.cancel_initiated_at is not None and canceling.processing_status in ("canceling", "ended")
    done = wait_ended(client, batch.id)
    assert (done.request_counts.succeeded, done.request_counts.canceled, counted(done)) == (3, 20, 23)
    lines = results(client, batch.id)
    assert {lines[f"slow{i}"].type for i in range(20)} == {"canceled"} and lines["quick0"].type == "succeeded"
    manifest = stored_manifest(batch.id)  # issue 19 bug 3: it said 3 lines (the succeeded ones)
    assert manifest["output"]["lines"] == len(lines) == 23 and manifest["errors"] is None  # one results file
    with pytest.raises(anthropic.BadRequestError, match="cannot be canceled"):
        client.messages.batches.cancel(batch.id)
    assert client.messages.batches.delete(batch.id).type == "message_batch_deleted"


def test_requests_left_when_the_batch_expires_end_as_expired_and_those_generating_with_their_text_so_far(
    api: LiveServer,
) -> None:
    from sqlalchemy import update

    from storage.db import transaction
    from storage.models import Batch, BatchRequest

    client = client_for(api, make_key("acme"))
    batch = client.messages.batches.create(
        requests=[req("done", max_tokens=2)] + [req(f"late{i}", max_tokens=10**8) for i in range(12)]
    )
    while client.messages.batches.retrieve(batch.id).request_counts.succeeded < 1:
        time.sleep(0.05)
    past = int(time.time()) - 1  # the 24 hours are up
    with transaction() as session:
        session.execute(update(Batch).where(Batch.id == batch.id).values(expires_at=past))
        session.execute(update(BatchRequest).where(BatchRequest.batch_id == batch.id).values(deadline=past))
    done = wait_ended(client, batch.id, timeout=30)
    cut, expired = done.request_counts.succeeded - 1, done.request_counts.expired
    assert cut >= 1 and expired >= 4 and cut + expired == 12 and counted(done) == 13  # 8 in flight at most
    lines = results(client, batch.id)
    assert lines["done"].type == "succeeded" and "backfill" not in (lines["done"].message.model_extra or {})
    late = [lines[f"late{i}"] for i in range(12)]
    assert {line.type for line in late} == {"succeeded", "expired"}
    for line in (line for line in late if line.type == "succeeded"):  # cut short at expiry (docs/workflow.md)
        assert line.message.stop_reason == "max_tokens" and line.message.usage.output_tokens >= 1
        assert (line.message.model_extra or {})["backfill"] == {"cut_by": "expiry"}


def test_a_paused_batchs_requests_end_at_expiry_with_the_text_generated_before_the_pause(api: LiveServer) -> None:
    from sqlalchemy import func, select, update

    from storage.db import transaction
    from storage.models import Batch, BatchRequest

    def running() -> int:
        with transaction() as session:
            query = select(func.count()).where(BatchRequest.batch_id == batch.id, BatchRequest.status == "running")
            return int(session.scalar(query) or 0)

    client = client_for(api, make_key("acme"))
    batch = client.messages.batches.create(requests=[req(f"late{i}", max_tokens=10**8) for i in range(12)])
    while not running():
        time.sleep(0.05)
    time.sleep(0.2)  # some tokens generated
    client.post(f"/v1/messages/batches/{batch.id}/pause", body={}, cast_to=anthropic.types.messages.MessageBatch)
    while running():  # the worker's next renewal (within 2 s) hands them back with their tokens
        time.sleep(0.1)
    with transaction() as session:
        held = session.execute(
            select(BatchRequest.custom_id, BatchRequest.checkpoint_tokens).where(BatchRequest.batch_id == batch.id)
        ).all()
        generating = {custom_id: tokens for custom_id, tokens in held if tokens > 0}
        past = int(time.time()) - 1  # the 24 hours are up while it is paused
        session.execute(update(Batch).where(Batch.id == batch.id).values(expires_at=past))
        session.execute(update(BatchRequest).where(BatchRequest.batch_id == batch.id).values(deadline=past))
    assert generating
    done = wait_ended(client, batch.id, timeout=30)
    lines = results(client, batch.id)
    assert sorted(lines) == sorted(f"late{i}" for i in range(12))  # each once
    assert sorted(cid for cid, line in lines.items() if line.type == "succeeded") == sorted(generating)
    assert {line.type for cid, line in lines.items() if cid not in generating} == {"expired"}
    for custom_id, tokens in generating.items():
        message = lines[custom_id].message
        assert message.stop_reason == "max_tokens" and message.usage.output_tokens == tokens  # none after the pause
        assert (message.model_extra or {})["backfill"] == {"cut_by": "expiry"}
    assert done.request_counts.succeeded == len(generating) and counted(done) == 12


def test_results_are_archived_after_their_retention_and_the_batch_stays_visible(api: LiveServer) -> None:
    from sqlalchemy import update

    from storage.db import transaction
    from storage.files.blobs import get_blob_store
    from storage.models import Batch, File
    from worker.process import service

    client = client_for(api, make_key("acme"))
    done = wait_ended(client, client.messages.batches.create(requests=[req("a"), req("b")]).id)
    assert len(results(client, done.id)) == 2
    with transaction() as session:
        output_file_id = session.get(Batch, done.id).output_file_id  # type: ignore[union-attr]
        key = session.get(File, output_file_id).blob_key  # type: ignore[union-attr]
        session.execute(update(Batch).where(Batch.id == done.id).values(completed_at=int(time.time()) - 29 * 86400 - 1))
    assert get_blob_store().exists(key)
    assert service.archive_once() == 2  # the input and the results objects
    archived = client.messages.batches.retrieve(done.id)
    assert archived.archived_at is not None and archived.processing_status == "ended" and counted(archived) == 2
    assert not get_blob_store().exists(key)
    with pytest.raises(anthropic.NotFoundError, match="archived"):
        list(client.messages.batches.results(done.id))
    assert service.archive_once() == 0


@pytest.mark.backfill_env({**ENV, "BACKFILL_ENQUEUED_TOKEN_LIMIT": "5"})
def test_a_batch_refused_at_admission_ends_with_every_request_errored(api: LiveServer) -> None:
    client = client_for(api, make_key("acme"))
    done = wait_ended(client, client.messages.batches.create(requests=[req("a"), req("b")]).id)
    assert (done.request_counts.errored, counted(done)) == (2, 2)
    lines = results(client, done.id)
    assert {line.error.error.type for line in lines.values()} == {"rate_limit_error"}
    assert "Enqueued token limit" in lines["a"].error.error.message


def test_every_error_leaves_in_anthropics_envelope_with_its_status(api: LiveServer) -> None:
    key = make_key("acme")
    body = {"requests": [req("a")]}
    assert_envelope(raw(api, "POST", "/v1/messages/batches", json=body), 401, "authentication_error", "x-api-key")
    wrong = raw(
        api,
        "GET",
        "/v1/messages/batches/msgbatch_x",
        headers={"x-api-key": "sk-wrong", "anthropic-version": "2023-06-01"},
    )
    assert_envelope(wrong, 401, "authentication_error")
    with pytest.raises(anthropic.AuthenticationError):
        client_for(api, "sk-wrong").messages.batches.list()
    bearer = raw(api, "POST", "/v1/messages/batches", json=body, headers={"Authorization": f"Bearer {key}"})
    assert bearer.status_code == 200 and bearer.json()["type"] == "message_batch"
    mine = bearer.json()["id"]
    other = make_key("globex")
    for method, path in (
        ("GET", f"/v1/messages/batches/{mine}"),
        ("POST", f"/v1/messages/batches/{mine}/cancel"),
        ("DELETE", f"/v1/messages/batches/{mine}"),
        ("GET", f"/v1/messages/batches/{mine}/results"),
        ("GET", "/v1/messages/batches/msgbatch_missing"),
    ):
        assert_envelope(raw(api, method, path, headers={"x-api-key": other}), 404, "not_found_error")
    shape = {"requests": [req("ok"), req("bad id"), {"custom_id": "c"}, req("ok")]}
    response = raw(api, "POST", "/v1/messages/batches", json=shape, headers={"x-api-key": key})
    assert_envelope(response, 400, "invalid_request_error", "3 invalid requests (indices 1-3)")
    big = {"requests": [req(f"r{i}", system="x" * 2000) for i in range(40)]}  # > 64 KiB
    assert_envelope(
        raw(api, "POST", "/v1/messages/batches", json=big, headers={"x-api-key": key}), 413, "request_too_large"
    )
    chunked = raw(
        api, "POST", "/v1/messages/batches", content=iter([json.dumps(big).encode()]), headers={"x-api-key": key}
    )
    assert_envelope(chunked, 413, "request_too_large")  # no Content-Length: counted while streaming
    assert_envelope(
        raw(api, "POST", "/v1/messages/batches", content=b"{nope", headers={"x-api-key": key}),
        400,
        "invalid_request_error",
        "not valid JSON",
    )
    assert_envelope(
        raw(api, "GET", f"/v1/messages/batches/{mine}/nope", headers={"x-api-key": key}), 404, "not_found_error"
    )
    assert_envelope(
        raw(api, "PUT", f"/v1/messages/batches/{mine}", headers={"x-api-key": key}), 405, "invalid_request_error"
    )
    # OpenAI's routes keep OpenAI's envelope.
    openai_error = raw(api, "GET", "/v1/batches", headers={"Authorization": "Bearer sk-wrong"})
    assert openai_error.status_code == 401 and openai_error.json()["error"]["code"] == "invalid_api_key"
