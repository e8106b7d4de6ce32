"""Files through the official openai SDK: upload, list, retrieve, download, delete, tenant isolation."""

from __future__ import annotations

import io
import json

import httpx
import openai
import pytest

from tests.conftest import LiveServer, make_key

pytestmark = pytest.mark.backfill_env({"BACKFILL_MODELS": '{"fake-model": {"path": "fake:"}}'})


def jsonl(n: int, model: str = "fake-model") -> bytes:
    lines = [
        {
            "custom_id": f"r{i}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {"model": model, "messages": [{"role": "user", "content": f"hi {i}"}], "max_tokens": 4},
        }
        for i in range(n)
    ]
    return b"".join(json.dumps(line).encode() + b"\n" for line in lines)


def test_upload_retrieve_download_delete(api: LiveServer) -> None:
    client = api.client(make_key("acme"))
    data = jsonl(3)
    uploaded = client.files.create(file=("jobs.jsonl", io.BytesIO(data)), purpose="batch")
    assert uploaded.id.startswith("file-") and uploaded.bytes == len(data) and uploaded.purpose == "batch"
    assert client.files.retrieve(uploaded.id).filename == "jobs.jsonl"
    assert client.files.content(uploaded.id).content == data
    assert [f.id for f in client.files.list()] == [uploaded.id]
    assert client.files.delete(uploaded.id).deleted is True
    with pytest.raises(openai.NotFoundError):
        client.files.retrieve(uploaded.id)


def test_another_tenant_sees_a_foreign_file_as_missing(api: LiveServer) -> None:
    mine = api.client(make_key("acme")).files.create(file=("a.jsonl", io.BytesIO(jsonl(1))), purpose="batch")
    other = api.client(make_key("globex"))
    with pytest.raises(openai.NotFoundError) as foreign:
        other.files.retrieve(mine.id)
    with pytest.raises(openai.NotFoundError) as missing:
        other.files.retrieve("file-doesnotexist")
    assert foreign.value.body["message"].replace(mine.id, "X") == missing.value.body["message"].replace(
        "file-doesnotexist", "X"
    )
    assert list(other.files.list()) == []
    with pytest.raises(openai.NotFoundError):
        other.files.content(mine.id)


def test_missing_or_wrong_key_is_401_with_openai_envelope(api: LiveServer) -> None:
    response = httpx.get(f"{api.base_url}/v1/files")
    assert response.status_code == 401
    assert set(response.json()["error"]) == {"message", "type", "param", "code"}
    with pytest.raises(openai.AuthenticationError):
        api.client("sk-wrong").files.list()


def test_non_jsonl_and_empty_uploads_are_rejected(api: LiveServer) -> None:
    client = api.client(make_key("acme"))
    with pytest.raises(openai.BadRequestError) as binary:
        client.files.create(file=("x.jsonl", io.BytesIO(b"\x89PNG\r\n\x1a\n\x00\xff")), purpose="batch")
    assert "UTF-8" in binary.value.message
    with pytest.raises(openai.BadRequestError) as csv:
        client.files.create(file=("x.csv", io.BytesIO(b"a,b,c\n1,2,3\n")), purpose="batch")
    assert "JSONL" in csv.value.message
    with pytest.raises(openai.BadRequestError) as empty:
        client.files.create(file=("x.jsonl", io.BytesIO(b"")), purpose="batch")
    assert "empty" in empty.value.message
    assert list(client.files.list()) == []
