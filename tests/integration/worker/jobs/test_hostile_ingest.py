"""Ingest under hostile input: bad lines are capped data, an unexplained failure is bounded (issue 14, items 1-2)."""

from __future__ import annotations

import json

import pytest

from storage.batches.batches import create_batch, get_batch
from storage.db import transaction
from storage.files.blobs import get_blob_store
from storage.files.files import create_file
from storage.tenants import get_or_create_tenant
from tests.conftest import Backend
from tests.integration.jobs import chat, create_job
from worker.process import service

pytestmark = pytest.mark.backfill_env(
    {
        "BACKFILL_MODELS": json.dumps({"fake-model": {"path": "fake:"}}),
        "BACKFILL_INGEST_MAX_ATTEMPTS": "3",
        "BACKFILL_INGEST_RETRY_SECONDS": "0",
    }
)


def batch_of(data: bytes, *, delete_object: bool = False) -> str:
    with transaction() as session:
        tenant = get_or_create_tenant(session, name="mallory")
        source = create_file(
            session, get_blob_store(), tenant_id=tenant.id, filename="a.jsonl", purpose="batch", chunks=[data]
        )
        if delete_object:
            get_blob_store().delete(source.blob_key)
        return create_batch(
            session,
            tenant_id=tenant.id,
            input_file_id=source.id,
            endpoint="/v1/chat/completions",
            completion_window="24h",
            model="fake-model",
            metadata=None,
        ).id


def test_a_file_of_thousands_of_bad_lines_stores_the_first_hundred_and_a_count(backend: Backend) -> None:
    url = "/v1/" + "u" * 5000
    bad = b"".join(json.dumps({**chat(i), "url": url}).encode() + b"\n" for i in range(1, 3001))
    batch_id = batch_of(json.dumps(chat(0)).encode() + b"\n" + bad)
    assert service.ingest(batch_id) == "failed"
    with transaction() as session:
        errors = get_batch(session, tenant_id=None, batch_id=batch_id).errors
    assert errors is not None and len(errors) == 101
    assert all(entry["code"] == "mismatched_url" and len(entry["message"]) < 400 for entry in errors[:100])
    assert errors[100]["code"] == "too_many_errors" and "2,900 more" in errors[100]["message"]
    assert len(json.dumps(errors)) < 40_000  # was ~15 MB: every 5 kB url echoed 3,000 times


def test_deep_and_huge_integer_lines_fail_validation_on_the_real_queue(backend: Backend) -> None:
    line = chat(1)
    line["body"]["max_tokens"] = 2**63
    deep = chat(2)
    deep["body"]["x"] = json.loads("[" * 260 + "]" * 260)
    batch_id = create_job([chat(0), line, deep])
    assert service.ingest(batch_id) == "failed"
    with transaction() as session:
        errors = get_batch(session, tenant_id=None, batch_id=batch_id).errors
    assert [(entry["line"], entry["code"]) for entry in errors or []] == [
        (2, "integer_out_of_range"),
        (3, "too_deeply_nested"),
    ]


def test_the_largest_storable_values_are_enqueued(backend: Backend) -> None:
    line = chat(1)
    line["body"]["max_tokens"] = 2**63 - 1
    line["body"]["seed"] = -(2**63)
    deep = chat(2)
    deep["body"]["x"] = json.loads("[" * 60 + "]" * 60)
    batch_id = create_job([chat(0), line, deep])
    assert service.ingest(batch_id) == "in_progress"


def test_an_ingest_that_keeps_raising_fails_its_batch_after_the_attempt_limit(backend: Backend) -> None:
    broken = batch_of(b"{}\n", delete_object=True)
    healthy = create_job([chat(i) for i in range(3)])
    assert [service.ingest(broken) for _ in range(2)] == ["validating", "validating"]  # never raises
    assert service.ingest(healthy) == "in_progress"
    assert service.ingest(broken) == "failed"
    with transaction() as session:
        batch = get_batch(session, tenant_id=None, batch_id=broken)
        assert batch.ingest_attempts == 3 and batch.failed_at is not None
        [error] = batch.errors or []
    assert error["code"] == "ingest_failed" and "after 3 attempts" in error["message"]
    assert service.ingest(broken) == "failed"  # idempotent afterwards


def test_a_batch_backing_off_is_not_offered_to_ingest_until_its_retry_time(
    backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    from storage.settings import get_settings

    monkeypatch.setattr(get_settings(), "ingest_retry_seconds", 3600)
    broken = batch_of(b"{}\n", delete_object=True)
    assert service.ingest(broken) == "validating"
    with transaction() as session:
        assert broken not in service.pending_ingest(session)
