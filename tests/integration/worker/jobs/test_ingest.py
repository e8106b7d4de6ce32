"""Ingest keeps no growing set of custom_ids: the queue's unique index finds a repeated one, and the file is
then checked again so every duplicate line is reported with its number and nothing is queued."""

from __future__ import annotations

import json

import pytest
from sqlalchemy import func, select

from storage.batches.batches import get_batch
from storage.db import transaction
from storage.models import BatchRequest
from tests.conftest import Backend
from tests.integration.jobs import chat, submit_job
from worker.jobs import ingest

pytestmark = pytest.mark.backfill_env({"BACKFILL_MODELS": json.dumps({"fake-model": {"path": "fake:"}})})


def test_repeated_custom_ids_far_apart_are_each_reported_and_nothing_is_queued(
    backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ingest, "INSERT_CHUNK", 50)  # the first of each pair is in the queue long before
    lines = [chat(i) for i in range(600)]
    lines[450]["custom_id"] = "r10"
    lines[599]["custom_id"] = "r20"
    batch_id, status = submit_job(lines)
    assert status == "failed"
    with transaction() as session:
        batch = get_batch(session, tenant_id=None, batch_id=batch_id)
        errors = [(e["line"], e["code"]) for e in batch.errors]
        queued = session.scalar(select(func.count()).where(BatchRequest.batch_id == batch_id))
    assert errors == [(451, "duplicate_custom_id"), (600, "duplicate_custom_id")]
    assert queued == 0


def test_a_file_of_distinct_custom_ids_is_queued_whole(backend: Backend, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ingest, "INSERT_CHUNK", 50)
    batch_id, status = submit_job([chat(i) for i in range(600)])
    assert status == "in_progress"
    with transaction() as session:
        queued = session.scalar(select(func.count()).where(BatchRequest.batch_id == batch_id))
        assert get_batch(session, tenant_id=None, batch_id=batch_id).request_total == queued == 600
