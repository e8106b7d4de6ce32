"""The Uploads API through the official SDK (`client.uploads.upload_file_chunked`) and its raw routes, on both stores
(a local folder; S3 on moto): parts go straight into the store's multipart object, completing makes them a File in
place, and every fault ends with a clear error and nothing left behind in the store once the sweep ran."""

from __future__ import annotations

import hashlib
import io
import json
import os
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import httpx
import openai
import pytest
from sqlalchemy import select, update

from storage.clock import now
from storage.db import transaction
from storage.files.blobs import get_blob_store
from storage.files.uploads import sweep_uploads
from storage.models import File, Upload
from storage.settings import get_settings
from tests.conftest import Backend, LiveServer, make_key, start_server
from tests.integration.api.conftest import FAKE_MODELS
from tests.integration.api.helpers import read_lines, wait_for

MIB = 1024 * 1024
PART = 5 * MIB  # S3's smallest part but the last (moto enforces it too)
pytestmark = pytest.mark.backfill_env({"BACKFILL_MODELS": FAKE_MODELS})


def jsonl(size: int, *, tag: str = "") -> bytes:
    """About `size` bytes of valid batch lines (padded prompts), ending on a line break."""
    pad = "x" * 100_000  # few lines: the batch a test runs stays small
    lines, total, i = [], 0, 0
    while total < size:
        body = {"model": "fake-model", "messages": [{"role": "user", "content": f"{tag}{i} {pad}"}], "max_tokens": 2}
        line = json.dumps({"custom_id": f"r{i}", "method": "POST", "url": "/v1/chat/completions", "body": body})
        lines.append(line.encode() + b"\n")
        total += len(lines[-1])
        i += 1
    return b"".join(lines)


def tenant() -> str:
    return f"up-{uuid.uuid4().hex[:8]}"  # its own folder in the shared bucket: the listing sees only this test


def stored_keys(folder: str) -> set[str]:
    """Everything the store holds under the tenant's folder: objects, and on S3 its open multipart uploads too."""
    blobs: Any = get_blob_store()
    if hasattr(blobs, "client"):
        listed = blobs.client.list_objects_v2(Bucket=blobs.bucket, Prefix=folder + "/").get("Contents", [])
        uploads = blobs.client.list_multipart_uploads(Bucket=blobs.bucket, Prefix=folder + "/").get("Uploads", [])
        return {item["Key"] for item in listed} | {f"multipart:{item['Key']}" for item in uploads}
    root = get_settings().data_dir / "objects" / folder
    return (
        {str(path.relative_to(root.parent)) for path in root.rglob("*") if path.is_file()} if root.exists() else set()
    )


def live_file_keys(folder: str) -> set[str]:
    """The keys the store should hold: live files' objects (a local multipart file: its manifest and parts)."""
    with transaction() as session:
        keys = set(session.scalars(select(File.blob_key).where(File.deleted_at.is_(None))))
    keys = {key for key in keys if key.startswith(folder + "/")}
    if hasattr(get_blob_store(), "client"):
        return keys
    root = get_settings().data_dir / "objects"
    return {
        str(path.relative_to(root)) for key in keys for path in [root / key, *(root / key).rglob("*")] if path.is_file()
    }


def sweep() -> None:
    with transaction() as session:
        sweep_uploads(session, get_blob_store(), limit=100)


def raw(api: LiveServer, key: str) -> httpx.Client:
    return httpx.Client(base_url=api.base_url, headers={"Authorization": f"Bearer {key}"}, timeout=60)


def send_part(http: httpx.Client, upload_id: str, data: bytes) -> httpx.Response:
    return http.post(f"/v1/uploads/{upload_id}/parts", files={"data": ("blob", data)})


def new_upload(client: openai.OpenAI, size: int, name: str = "jobs.jsonl") -> Any:
    return client.uploads.create(bytes=size, filename=name, mime_type="application/jsonl", purpose="batch")


def test_the_sdks_chunked_upload_becomes_a_batch_input_file_hashed_at_ingest(api: LiveServer, tmp_path: Path) -> None:
    client = api.client(make_key(tenant()))
    data = jsonl(2 * PART + 300_000)
    source = tmp_path / "jobs.jsonl"
    source.write_bytes(data)
    done = client.uploads.upload_file_chunked(
        file=source, mime_type="application/jsonl", purpose="batch", part_size=PART
    )
    assert (done.status, done.bytes, done.filename, done.purpose) == ("completed", len(data), "jobs.jsonl", "batch")
    assert done.file is not None and done.file.bytes == len(data) and done.file.purpose == "batch"
    assert done.expires_at == done.created_at + 3600
    assert client.files.content(done.file.id).content == data
    batch = client.batches.create(input_file_id=done.file.id, endpoint="/v1/chat/completions", completion_window="24h")
    batch = wait_for(client, batch.id)
    assert batch.status == "completed" and batch.request_counts.completed == data.count(b"\n")
    assert len(read_lines(client, batch.output_file_id)) == data.count(b"\n")
    with transaction() as session:  # the File's SHA-256 was taken by ingest's one read of it
        assert session.get(File, done.file.id).sha256 == hashlib.sha256(data).hexdigest()  # type: ignore[union-attr]


def test_an_md5_is_checked_at_complete_and_a_mismatch_cancels_the_upload(api: LiveServer) -> None:
    folder = tenant()
    client = api.client(make_key(folder))
    data = jsonl(100_000)
    good = client.uploads.upload_file_chunked(
        file=data,
        filename="a.jsonl",
        bytes=len(data),
        mime_type="text/jsonl",
        purpose="batch",
        md5=hashlib.md5(data).hexdigest(),
    )
    assert good.status == "completed" and good.file is not None
    with transaction() as session:  # the md5 pass took the SHA-256 too
        assert session.get(File, good.file.id).sha256 == hashlib.sha256(data).hexdigest()  # type: ignore[union-attr]
    upload = new_upload(client, len(data))
    part = client.uploads.parts.create(upload.id, data=data)
    with pytest.raises(openai.BadRequestError) as refused:
        client.uploads.complete(upload.id, part_ids=[part.id], md5="0" * 32)
    assert refused.value.code == "md5_mismatch" and refused.value.param == "md5"
    with pytest.raises(openai.ConflictError, match="already cancelled"):
        client.uploads.complete(upload.id, part_ids=[part.id])
    assert [f.id for f in client.files.list()] == [good.file.id]
    assert stored_keys(folder) == live_file_keys(folder)


def test_bad_part_lists_get_clear_errors_and_the_upload_stays_usable(api: LiveServer, backend: Backend) -> None:
    client = api.client(make_key(tenant()))
    data = jsonl(2 * PART + 1000)
    first, second = data[:PART], data[PART:]
    upload = new_upload(client, len(data))
    one = client.uploads.parts.create(upload.id, data=first)
    two = client.uploads.parts.create(upload.id, data=second)
    other = new_upload(client, 10)
    foreign = client.uploads.parts.create(other.id, data=b"0123456789")
    cases = {
        "is listed twice": [one.id, one.id, two.id],
        f"{foreign.id} is not a part of upload": [one.id, foreign.id],
        "part_nope is not a part of upload": [one.id, "part_nope"],
        "list at least one part": [],
        f"hold {PART} bytes; upload": [one.id],  # the declared size is not reached
    }
    for message, part_ids in cases.items():
        with pytest.raises(openai.BadRequestError, match=message) as refused:
            client.uploads.complete(upload.id, part_ids=part_ids)
        assert refused.value.param == "part_ids"
    small = new_upload(client, 10 + PART)
    tiny = client.uploads.parts.create(small.id, data=b"0123456789")
    big = client.uploads.parts.create(small.id, data=first)
    with pytest.raises(openai.BadRequestError, match="every part but the last must hold at least") as refused:
        client.uploads.complete(small.id, part_ids=[tiny.id, big.id])
    assert refused.value.code == "part_too_small"
    # Listed in another order than they arrived: the local store's manifest takes any order; S3 joins parts by
    # number (arrival order) and says so.
    swapped = new_upload(client, 2 * PART)
    late = client.uploads.parts.create(swapped.id, data=data[PART : 2 * PART])
    early = client.uploads.parts.create(swapped.id, data=first)
    if backend.name == "embedded":
        done = client.uploads.complete(swapped.id, part_ids=[early.id, late.id])
        assert done.file is not None and client.files.content(done.file.id).content == data[: 2 * PART]
    else:
        with pytest.raises(openai.BadRequestError) as refused:
            client.uploads.complete(swapped.id, part_ids=[early.id, late.id])
        assert refused.value.code == "parts_out_of_order"
    done = client.uploads.complete(upload.id, part_ids=[one.id, two.id])  # still pending after every refusal
    assert done.status == "completed" and client.files.content(done.file.id).content == data  # type: ignore[union-attr]


def test_part_and_upload_limits_are_refused_before_anything_is_stored(api: LiveServer) -> None:
    client = api.client(make_key(tenant()))
    http = raw(api, make_key(tenant()))
    limit = get_settings().upload_part_max_bytes
    with pytest.raises(openai.BadRequestError, match="between 1 and"):
        new_upload(client, get_settings().upload_total_max_bytes + 1)
    with pytest.raises(openai.BadRequestError, match="uploads support 'batch'"):
        client.uploads.create(bytes=10, filename="a.jsonl", mime_type="application/jsonl", purpose="assistants")
    upload = new_upload(client, 10)
    url = urlparse(api.base_url)
    with socket.create_connection((url.hostname, url.port), timeout=10) as sock:  # no byte of the body is sent
        sock.sendall(
            f"POST /v1/uploads/{upload.id}/parts HTTP/1.1\r\nHost: {url.netloc}\r\nAuthorization: Bearer x\r\n"
            f"Content-Type: multipart/form-data; boundary=b\r\nContent-Length: {limit + MIB}\r\n\r\n".encode()
        )
        answer = sock.recv(65536)
    assert answer.startswith(b"HTTP/1.1 413") and b"part_too_large" in answer
    assert send_part(http, upload.id, b"x").status_code == 404  # another tenant's upload is not found
    with transaction() as session:  # as if 10,000 part numbers had been handed out already
        session.execute(update(Upload).where(Upload.id == upload.id).values(parts_started=10_000))
    with pytest.raises(openai.BadRequestError, match="already has 10000 parts") as refused:
        client.uploads.parts.create(upload.id, data=b"0123456789")
    assert refused.value.code == "too_many_parts"
    with pytest.raises(openai.NotFoundError):
        client.uploads.parts.create("upload_nope", data=b"x")


@pytest.mark.backfill_env({"BACKFILL_MODELS": FAKE_MODELS, "BACKFILL_UPLOAD_PART_MAX_BYTES": str(64 * 1024)})
def test_a_streamed_part_past_the_limit_is_cut_off(api: LiveServer) -> None:
    client = api.client(make_key(tenant()))
    upload = new_upload(client, 1000)
    with pytest.raises(openai.APIStatusError) as refused:
        client.uploads.parts.create(upload.id, data=b"x" * (64 * 1024 + 1))
    assert refused.value.status_code == 413


def test_an_upload_completed_twice_at_once_makes_one_file(api: LiveServer) -> None:
    client = api.client(make_key(tenant()))
    data = jsonl(50_000)
    upload = new_upload(client, len(data))
    part = client.uploads.parts.create(upload.id, data=data)
    results: list[Any] = []
    start = threading.Barrier(2)

    def complete() -> None:
        start.wait()
        try:
            results.append(client.uploads.complete(upload.id, part_ids=[part.id]))
        except openai.ConflictError as error:
            results.append(error)

    threads = [threading.Thread(target=complete) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    done = [r for r in results if not isinstance(r, Exception)]
    refused = [r for r in results if isinstance(r, openai.ConflictError)]
    assert len(done) == 1 and len(refused) == 1 and "already completed" in str(refused[0])
    assert [f.id for f in client.files.list()] == [done[0].file.id]


def slow_part(data: bytes, started: threading.Event, go_on: threading.Event) -> Iterator[bytes]:
    boundary = "slowpart"
    yield f'--{boundary}\r\nContent-Disposition: form-data; name="data"; filename="blob"\r\n\r\n'.encode()
    yield data[: len(data) // 2]
    started.set()
    go_on.wait(30)
    yield data[len(data) // 2 :]
    yield f"\r\n--{boundary}--\r\n".encode()


def test_a_cancel_while_a_part_arrives_leaves_nothing_behind(api: LiveServer) -> None:
    folder = tenant()
    key = make_key(folder)
    client, http = api.client(key), raw(api, key)
    data = jsonl(3 * MIB)
    upload = new_upload(client, 2 * len(data))
    kept = client.uploads.parts.create(upload.id, data=data)
    started, go_on = threading.Event(), threading.Event()
    answers: list[httpx.Response] = []
    headers = {"Content-Type": "multipart/form-data; boundary=slowpart"}
    sender = threading.Thread(
        target=lambda: answers.append(
            http.post(f"/v1/uploads/{upload.id}/parts", headers=headers, content=slow_part(data, started, go_on))
        )
    )
    sender.start()
    assert started.wait(30)
    cancelled = client.uploads.cancel(upload.id)
    assert cancelled.status == "cancelled" and client.uploads.cancel(upload.id).status == "cancelled"
    go_on.set()
    sender.join(60)
    assert answers[0].status_code == 409 and answers[0].json()["error"]["code"] == "upload_not_pending"
    with pytest.raises(openai.ConflictError, match="already cancelled"):
        client.uploads.complete(upload.id, part_ids=[kept.id])
    sweep()
    assert stored_keys(folder) == set()


def test_abandoned_uploads_expire_after_their_hour_and_the_sweep_removes_their_parts(api: LiveServer) -> None:
    folder = tenant()
    client = api.client(make_key(folder))
    upload = new_upload(client, 20)
    part = client.uploads.parts.create(upload.id, data=b"0123456789")
    assert stored_keys(folder)  # the part (S3: the open multipart upload) is in the store
    with transaction() as session:
        session.execute(update(Upload).where(Upload.id == upload.id).values(expires_at=now() - 1))
    with pytest.raises(openai.ConflictError, match="has expired"):
        client.uploads.parts.create(upload.id, data=b"0123456789")
    with pytest.raises(openai.ConflictError, match="has expired"):
        client.uploads.complete(upload.id, part_ids=[part.id])
    sweep()
    with transaction() as session:
        row = session.get(Upload, upload.id)
        assert row is not None and (row.status, row.parts_cleared) == ("expired", True)
    assert stored_keys(folder) == set()


def test_the_api_restarted_between_parts_and_a_client_gone_mid_part_lose_nothing(backend: Backend) -> None:
    folder = tenant()
    key = make_key(folder)
    data = jsonl(PART + 200_000)
    server, stop = start_server(with_worker=False)
    upload = new_upload(server.client(key), len(data))
    first = server.client(key).uploads.parts.create(upload.id, data=data[:PART])
    stop()
    server, stop = start_server(with_worker=False)
    try:
        url = urlparse(server.base_url)
        with socket.create_connection((url.hostname, url.port), timeout=10) as sock:  # gone halfway through a part
            sock.sendall(
                f"POST /v1/uploads/{upload.id}/parts HTTP/1.1\r\nHost: {url.netloc}\r\nAuthorization: Bearer {key}"
                f"\r\nContent-Type: multipart/form-data; boundary=b\r\nContent-Length: {10 * MIB}\r\n\r\n".encode()
                + b'--b\r\nContent-Disposition: form-data; name="data"\r\n\r\n'
                + b"x" * MIB
            )
            time.sleep(0.5)
        second = server.client(key).uploads.parts.create(upload.id, data=data[PART:])
        done = server.client(key).uploads.complete(upload.id, part_ids=[first.id, second.id])
        assert done.file is not None and server.client(key).files.content(done.file.id).content == data
        sweep()
        assert stored_keys(folder) == live_file_keys(folder)
    finally:
        stop()


@pytest.mark.backfill_env({"BACKFILL_MODELS": FAKE_MODELS, "BACKFILL_TENANT_MAX_STORED_BYTES": str(MIB)})
def test_pending_uploads_count_against_the_stored_bytes_quota(api: LiveServer) -> None:
    client = api.client(make_key(tenant()))
    with pytest.raises(openai.RateLimitError, match="past its quota"):
        new_upload(client, MIB + 1)
    upload = new_upload(client, MIB // 2 + 1)
    with pytest.raises(openai.RateLimitError, match="past its quota"):
        client.files.create(file=("a.jsonl", io.BytesIO(jsonl(MIB // 2))), purpose="batch")
    client.uploads.cancel(upload.id)
    assert client.files.create(file=("a.jsonl", io.BytesIO(jsonl(MIB // 2))), purpose="batch").bytes > 0


@pytest.mark.parametrize("backend", ["embedded"], indirect=True)  # S3 keeps no half-sent part
def test_a_local_part_left_half_written_by_a_killed_api_is_not_part_of_the_file(api: LiveServer) -> None:
    client = api.client(make_key(tenant()))
    data = jsonl(1000)
    upload = new_upload(client, len(data))
    part = client.uploads.parts.create(upload.id, data=data)
    with transaction() as session:
        row = session.get(Upload, upload.id)
        assert row is not None
        folder = get_settings().data_dir / "objects" / row.blob_key
    (folder / "part-00007.partial").write_bytes(b"half a part")  # what a SIGKILL mid-part leaves
    done = client.uploads.complete(upload.id, part_ids=[part.id])
    assert client.files.content(done.file.id).content == data  # type: ignore[union-attr]
    assert sorted(os.listdir(folder)) == ["manifest.json", "part-00001"]
    client.files.delete(done.file.id)  # type: ignore[union-attr]
    assert not folder.exists()
