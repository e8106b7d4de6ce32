"""Validation reports every bad line with its number, before any compute, and changes nothing else."""

from __future__ import annotations

import json

import httpx
import openai
import pytest
from sqlalchemy import func, select

from tests.conftest import LiveServer, make_key
from tests.integration.api.conftest import FAKE_MODELS
from tests.integration.api.helpers import chat_line, read_lines, to_jsonl, upload, wait_for

pytestmark = pytest.mark.backfill_env(
    {"BACKFILL_MODELS": FAKE_MODELS, "BACKFILL_BATCH_MAX_REQUESTS": "30", "BACKFILL_LINE_MAX_BYTES": "4096"}
)


def queue_rows() -> int:
    from storage.db import transaction
    from storage.models import BatchRequest

    with transaction() as session:
        return int(session.scalar(select(func.count()).select_from(BatchRequest)) or 0)


def create(client: openai.OpenAI, data: bytes) -> openai.types.Batch:
    source = upload(client, data)
    batch = client.batches.create(input_file_id=source.id, endpoint="/v1/chat/completions", completion_window="24h")
    return wait_for(client, batch.id)


def test_every_bad_line_is_reported_with_its_number(api: LiveServer) -> None:
    client = api.client(make_key("acme"))
    good = [chat_line(i) for i in range(3)]
    bad_lines = [
        json.dumps(good[0]),  # 1 ok
        "{not json",  # 2
        json.dumps({**chat_line(10), "custom_id": None}),  # 3 missing custom_id
        json.dumps(good[0]),  # 4 duplicate custom_id
        json.dumps({**chat_line(11), "method": "GET"}),  # 5
        json.dumps({**chat_line(12), "url": "/v1/embeddings"}),  # 6
        json.dumps(chat_line(13, model="other-model")),  # 7 different model
        json.dumps({**chat_line(14), "body": "text"}),  # 8 body not an object
        "[1, 2]",  # 9 not an object
        json.dumps(good[1]),  # 10 ok
    ]
    batch = create(client, ("\n".join(bad_lines) + "\n").encode())
    assert batch.status == "failed" and batch.failed_at
    reported = {(error.line, error.code) for error in batch.errors.data}
    assert reported == {
        (2, "invalid_json"),
        (3, "missing_required_parameter"),
        (4, "duplicate_custom_id"),
        (5, "invalid_method"),
        (6, "mismatched_url"),
        (7, "mismatched_model"),
        (8, "invalid_body"),
        (9, "invalid_json"),
    }
    assert all(error.message for error in batch.errors.data)
    assert batch.request_counts.total == 0 and batch.in_progress_at is None
    assert queue_rows() == 0


def test_crlf_bom_blank_lines_and_no_final_newline_are_accepted(api: LiveServer) -> None:
    client = api.client(make_key("acme"))
    body = "\r\n".join(json.dumps(chat_line(i)) for i in range(4))
    data = b"\xef\xbb\xbf" + body.encode() + b"\r\n\r\n" + json.dumps(chat_line(4)).encode()
    batch = create(client, data)
    assert batch.status == "completed", batch.errors
    assert batch.request_counts.total == 5
    assert len(read_lines(client, batch.output_file_id)) == 5


def test_too_many_requests_and_too_long_lines_fail_the_batch(api: LiveServer) -> None:
    client = api.client(make_key("acme"))
    batch = create(client, to_jsonl([chat_line(i) for i in range(31)]))
    assert batch.status == "failed"
    assert [(e.line, e.code) for e in batch.errors.data] == [(31, "too_many_requests")]
    long_line = chat_line(2, padding="x" * 5000)
    batch = create(client, to_jsonl([chat_line(1), long_line, chat_line(3)]))
    assert batch.status == "failed"
    assert [(e.line, e.code) for e in batch.errors.data] == [(2, "line_too_large")]


def test_oversized_upload_is_413_and_stores_nothing(api: LiveServer, monkeypatch: pytest.MonkeyPatch) -> None:
    from storage.settings import get_settings

    monkeypatch.setattr(get_settings(), "upload_max_bytes", 10_000)
    key = make_key("acme")
    client = api.client(key)
    with pytest.raises(openai.APIStatusError) as too_big:
        upload(client, to_jsonl([chat_line(i) for i in range(200)]))
    assert too_big.value.status_code == 413

    # A chunked upload without Content-Length is cut off while streaming, too.
    def body():  # type: ignore[no-untyped-def]
        boundary = b"--b\r\n"
        yield boundary + b'Content-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n'
        yield boundary + b'Content-Disposition: form-data; name="file"; filename="x.jsonl"\r\n\r\n'
        for i in range(200):
            yield json.dumps(chat_line(i)).encode() + b"\n"
        yield b"\r\n--b--\r\n"

    response = httpx.post(
        f"{api.base_url}/v1/files",
        content=body(),
        headers={"Authorization": f"Bearer {key}", "Content-Type": "multipart/form-data; boundary=b"},
    )
    assert response.status_code == 413 and response.json()["error"]["code"] == "file_too_large"
    assert list(client.files.list()) == []


def test_bad_input_leaves_other_batches_untouched(api: LiveServer) -> None:
    client = api.client(make_key("acme"))
    good = create(client, to_jsonl([chat_line(i) for i in range(5)]))
    before = client.batches.retrieve(good.id).model_dump()
    for broken in (b"{oops\n", to_jsonl([chat_line(0), chat_line(0)]), b"\n\n"):
        batch = create(client, broken)
        assert batch.status == "failed"
    assert client.batches.retrieve(good.id).model_dump() == before
    assert queue_rows() == 5
