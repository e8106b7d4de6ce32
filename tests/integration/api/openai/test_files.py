"""Files through the official openai SDK: upload, list, retrieve, download, delete, tenant isolation."""

from __future__ import annotations

import io
import json
import socket
import time
from collections.abc import Callable
from urllib.parse import urlparse

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


def multipart(*parts: tuple[str, bytes, str | None]) -> bytes:
    """A form body in the order given: (name, value, filename or None)."""
    body = b""
    for name, value, filename in parts:
        named = f'; filename="{filename}"' if filename else ""
        body += f'--b\r\nContent-Disposition: form-data; name="{name}"{named}\r\n\r\n'.encode() + value + b"\r\n"
    return body + b"--b--\r\n"


def post_form(api: LiveServer, key: str, body: bytes) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "multipart/form-data; boundary=b"}
    return httpx.post(f"{api.base_url}/v1/files", headers=headers, content=body)


def test_fields_sent_after_the_file_are_honoured_and_a_bad_one_leaves_nothing_behind(api: LiveServer) -> None:
    key = make_key("acme")
    data = jsonl(2)
    seconds = b"7200"
    ok = post_form(
        api,
        key,
        multipart(
            ("file", data, "late.jsonl"),
            ("purpose", b"batch", None),
            ("expires_after[anchor]", b"created_at", None),
            ("expires_after[seconds]", seconds, None),
        ),
    )
    assert ok.status_code == 200, ok.text
    assert ok.json()["expires_at"] - ok.json()["created_at"] == 7200 and ok.json()["filename"] == "late.jsonl"
    bad = post_form(api, key, multipart(("file", data, "late.jsonl"), ("purpose", b"fine-tune", None)))
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "purpose"
    missing = post_form(api, key, multipart(("file", data, "late.jsonl")))
    assert missing.status_code == 400 and missing.json()["error"]["param"] == "purpose"
    assert [f.id for f in api.client(key).files.list()] == [ok.json()["id"]]
    from storage.files.blobs import get_blob_store

    store = get_blob_store()
    if hasattr(store, "root"):  # the refused uploads' objects were removed
        assert [p.name for p in store.root.rglob("*") if p.is_file()] == [f"{ok.json()['id']}.jsonl"]


def test_a_body_cut_off_inside_the_file_or_with_two_files_is_a_400_and_stores_nothing(api: LiveServer) -> None:
    key = make_key("acme")
    form = multipart(("purpose", b"batch", None), ("file", jsonl(2), "a.jsonl"))
    cut = post_form(api, key, form[: -len(b"\r\n--b--\r\n") - 5])
    assert cut.status_code == 400 and cut.json()["error"]["param"] == "file"
    two = post_form(
        api, key, multipart(("purpose", b"batch", None), ("file", jsonl(1), "a.jsonl"), ("file", jsonl(1), "b.jsonl"))
    )
    assert two.status_code == 400 and "one 'file' part" in two.json()["error"]["message"]
    assert list(api.client(key).files.list()) == []


def open_uploads(store: object) -> set[str]:
    """What is being written now: open S3 multipart uploads (the bucket outlives one test, and the Uploads API
    keeps its uploads open until they complete or expire), or local `.partial` files."""
    if hasattr(store, "root"):
        return {str(path) for path in store.root.rglob("*") if path.name.endswith(".partial")}
    uploads = store.client.list_multipart_uploads(Bucket=store.bucket).get("Uploads", [])  # type: ignore[attr-defined]
    return {item["UploadId"] for item in uploads}


def stored_objects(store: object) -> list[str]:
    if hasattr(store, "root"):
        return [path.name for path in store.root.rglob("*") if path.is_file()]
    listed = store.client.list_objects_v2(Bucket=store.bucket)  # type: ignore[attr-defined]
    return [item["Key"] for item in listed.get("Contents", [])]


def wait_for(check: Callable[[], bool], what: str, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_a_client_that_goes_away_mid_file_leaves_no_object_no_part_and_no_row(api: LiveServer) -> None:
    """The route streams the file to storage as it arrives; a client that disconnects part-way (here after
    12 MiB, beyond the first 8 MiB S3 part) leaves no object, no open multipart upload and no file row."""
    from storage.files.blobs import get_blob_store

    key = make_key("acme")
    store = get_blob_store()
    before = stored_objects(store)  # the bucket outlives one test
    open_before = open_uploads(store)
    line = json.dumps({"custom_id": "r", "method": "POST", "url": "/v1/chat/completions", "body": {}}).encode()
    block = (line + b"\r\n") * (1024 * 1024 // (len(line) + 2))
    head = multipart(("purpose", b"batch", None), ("file", b"", "gone.jsonl"))[: -len(b"\r\n--b--\r\n")]
    url = urlparse(api.base_url)
    with socket.create_connection((url.hostname, url.port), timeout=30) as sock:
        sock.sendall(
            f"POST /v1/files HTTP/1.1\r\nHost: {url.netloc}\r\nAuthorization: Bearer {key}\r\n"
            f"Content-Type: multipart/form-data; boundary=b\r\nContent-Length: {64 * 1024 * 1024}\r\n\r\n".encode()
            + head
        )
        for _ in range(12):
            sock.sendall(block)
        wait_for(lambda: bool(open_uploads(store) - open_before), "the upload to reach object storage")
    wait_for(lambda: not open_uploads(store) - open_before, "the cut-off upload to be abandoned")
    assert stored_objects(store) == before
    assert list(api.client(key).files.list()) == []
    after = api.client(key).files.create(file=("next.jsonl", io.BytesIO(jsonl(2))), purpose="batch")
    assert after.bytes == len(jsonl(2))
