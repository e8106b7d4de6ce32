"""Filling the queue at ingest: one streamed COPY on Postgres keeps every line, in order, verbatim."""

from __future__ import annotations

import json

import pytest
from sqlalchemy import select, text

from storage.db import transaction
from storage.models import BatchRequest
from tests.conftest import Backend
from tests.integration.jobs import chat, submit_job
from worker.jobs import ingest

pytestmark = pytest.mark.backfill_env({"BACKFILL_MODELS": json.dumps({"fake-model": {"path": "fake:"}})})


def test_a_file_longer_than_many_chunks_lands_whole_with_awkward_characters_verbatim(
    backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ingest, "INSERT_CHUNK", 7)  # many hand-overs to the writer within one file
    awkward = "tab\there\nnewline \\backslash\\ \r \u2603 \\N \u0001"
    lines = [chat(i, system="shared system prompt" if i % 20 == 0 else None) for i in range(50)]
    for line in lines:
        line["body"]["messages"][-1]["content"] += awkward
    lines[3]["custom_id"] = "id with\ttab and \\N"

    batch_id, status = submit_job(lines)

    assert status == "in_progress"
    with transaction() as session:
        rows = session.execute(
            select(BatchRequest.line, BatchRequest.custom_id, BatchRequest.body, BatchRequest.prefix_key)
            .where(BatchRequest.batch_id == batch_id)
            .order_by(BatchRequest.line)
        ).all()
    assert [row.line for row in rows] == list(range(1, 51))
    assert [row.custom_id for row in rows] == [line["custom_id"] for line in lines]
    assert [row.body for row in rows] == [line["body"] for line in lines]
    shared = {row.prefix_key for row in rows if row.line % 20 == 1}
    assert len(shared) == 1 and "" not in shared  # the first row of the shared prefix got its key late


def test_a_bad_line_after_rows_were_streamed_leaves_no_rows(backend: Backend, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ingest, "INSERT_CHUNK", 5)
    lines = [chat(i) for i in range(30)]
    lines[25]["method"] = "GET"

    batch_id, status = submit_job(lines)

    assert status == "failed"
    with transaction() as session:
        assert session.scalars(select(BatchRequest.id).where(BatchRequest.batch_id == batch_id)).all() == []


def test_queue_bodies_are_compressed_with_lz4_on_postgres(backend: Backend) -> None:
    if backend.name != "postgres":
        pytest.skip("column compression is a Postgres matter")
    submit_job([chat(i) for i in range(3)])
    with transaction() as session:
        methods = session.execute(
            text("SELECT attname, attcompression FROM pg_attribute WHERE attrelid = 'batch_requests'::regclass")
        ).all()
    compression = {name: method for name, method in methods}
    assert compression["body"] == "l" and compression["response_body"] == "l"
