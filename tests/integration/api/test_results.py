"""The results layout for people who read the bucket: keys, the manifest, presigned links, old keys."""

from __future__ import annotations

import hashlib
import json
import time
from urllib.parse import parse_qs, urlparse

import httpx
import pytest

from storage.db import transaction
from storage.files.blobs import get_blob_store
from storage.lines.openai import BatchResultLine
from storage.models import Batch, File
from tests.conftest import Backend, LiveServer, make_key
from tests.integration.api.conftest import FAKE_MODELS
from tests.integration.api.helpers import chat_line, read_lines, to_jsonl, upload, wait_for

ENV = {"BACKFILL_MODELS": FAKE_MODELS, "BACKFILL_OBJECT_PREFIX": "backfill"}
pytestmark = pytest.mark.backfill_env(ENV)


def run_batch(api: LiveServer, key: str, lines: list[dict]) -> tuple[object, object]:  # type: ignore[type-arg]
    client = api.client(key)
    source = upload(client, to_jsonl(lines))
    batch = client.batches.create(input_file_id=source.id, endpoint="/v1/chat/completions", completion_window="24h")
    return client, wait_for(client, batch.id)


def blob_key(file_id: str) -> str:
    with transaction() as session:
        row = session.get(File, file_id)
        assert row is not None
        return row.blob_key


def object_bytes(key: str) -> bytes:
    return b"".join(get_blob_store().open_stream(key))


def test_a_batch_leaves_its_files_and_manifest_under_one_prefix_per_tenant(api: LiveServer) -> None:
    key = make_key("acme")
    lines = [chat_line(i) for i in range(5)] + [chat_line(9, temperature="hot")]  # a bad body: an error line
    client, done = run_batch(api, key, lines)
    assert done.status == "completed" and done.request_counts.failed == 1
    folder = f"backfill/acme/batches/{done.id}"
    assert blob_key(done.input_file_id) == f"backfill/acme/files/{done.input_file_id}.jsonl"
    assert blob_key(done.output_file_id) == f"{folder}/output.jsonl"
    assert blob_key(done.error_file_id) == f"{folder}/errors.jsonl"
    manifest = json.loads(object_bytes(f"{folder}/manifest.json"))
    assert (
        manifest
        == httpx.get(f"{api.base_url}/v1/batches/{done.id}/manifest", headers={"Authorization": f"Bearer {key}"}).json()
    )
    assert manifest["batch_id"] == done.id and manifest["status"] == "completed" and manifest["model"] == "fake-model"
    assert manifest["protocol"] == "openai" and manifest["tenant"] == "acme"
    assert manifest["request_counts"] == {"total": 6, "completed": 5, "failed": 1}
    assert manifest["completed_at"] == done.completed_at and manifest["created_at"] == done.created_at
    for kind, lines_in_it in (("output", 5), ("errors", 1)):
        entry = manifest[kind]
        data = object_bytes(entry["key"])
        assert entry["bytes"] == len(data) and entry["sha256"] == hashlib.sha256(data).hexdigest()
        assert entry["lines"] == lines_in_it == len(data.splitlines())
        assert client.files.content(entry["file_id"]).content == data
    assert manifest["input_file"]["key"] == f"backfill/acme/files/{done.input_file_id}.jsonl"
    assert manifest["cost"] == done.model_extra["cost"]


def test_a_tenant_name_that_is_not_a_plain_folder_name_gets_its_id(api: LiveServer) -> None:
    _, done = run_batch(api, make_key("Acme Corp/EU"), [chat_line(0)])
    with transaction() as session:
        batch = session.get(Batch, done.id)
        assert batch is not None and batch.manifest_key is not None
        assert batch.manifest_key == f"backfill/{batch.tenant_id}/batches/{done.id}/manifest.json"


def test_the_manifest_waits_for_the_batch_to_end_and_stays_with_its_tenant(api: LiveServer) -> None:
    key = make_key("acme")
    client = api.client(key)
    source = upload(client, to_jsonl([chat_line(i, max_tokens=10**8) for i in range(3)]))
    batch = client.batches.create(input_file_id=source.id, endpoint="/v1/chat/completions", completion_window="24h")
    wait_for(client, batch.id, {"in_progress"})
    early = httpx.get(f"{api.base_url}/v1/batches/{batch.id}/manifest", headers={"Authorization": f"Bearer {key}"})
    assert early.status_code == 404 and early.json()["error"]["code"] == "manifest_not_found"
    client.batches.cancel(batch.id)
    done = wait_for(client, batch.id)
    assert done.status == "cancelled"
    manifest = httpx.get(f"{api.base_url}/v1/batches/{batch.id}/manifest", headers={"Authorization": f"Bearer {key}"})
    assert manifest.json()["status"] == "cancelled" and manifest.json()["errors"]["lines"] == 3
    foreign = httpx.get(
        f"{api.base_url}/v1/batches/{batch.id}/manifest", headers={"Authorization": f"Bearer {make_key('globex')}"}
    )
    assert foreign.status_code == 404 and foreign.json()["error"]["code"] == "batch_not_found"


def test_presigned_links_read_the_object_without_an_api_key(api: LiveServer, backend: Backend) -> None:
    key = make_key("acme")
    _, done = run_batch(api, key, [chat_line(i) for i in range(3)])
    auth = {"Authorization": f"Bearer {key}"}
    link = httpx.get(f"{api.base_url}/v1/files/{done.output_file_id}/content_url?expires_in=600", headers=auth)
    if backend.name == "embedded":
        assert link.status_code == 400
        error = link.json()["error"]
        assert error["code"] == "presigned_urls_unavailable" and "local folder" in error["message"]
        assert set(error) == {"message", "type", "param", "code"}
        return
    assert link.status_code == 200, link.text
    body = link.json()
    assert body["object"] == "file.content_url" and body["expires_in"] == 600
    assert parse_qs(urlparse(body["url"]).query)["X-Amz-Expires"] == ["600"]
    fetched = httpx.get(body["url"])  # no API key, no AWS credentials: the URL is the permission
    assert fetched.status_code == 200 and fetched.content == api.client(key).files.content(done.output_file_id).content
    assert hashlib.sha256(fetched.content).hexdigest() == body["sha256"]
    manifest_link = httpx.get(f"{api.base_url}/v1/batches/{done.id}/manifest_url", headers=auth).json()
    assert manifest_link["expires_in"] == 3600  # BACKFILL_PRESIGN_DEFAULT_SECONDS
    assert httpx.get(manifest_link["url"]).json()["batch_id"] == done.id
    too_long = httpx.get(f"{api.base_url}/v1/files/{done.output_file_id}/content_url?expires_in=604801", headers=auth)
    assert too_long.status_code == 400 and too_long.json()["error"]["param"] == "expires_in"


@pytest.mark.backfill_env({**ENV, "BACKFILL_PRESIGN_MAX_SECONDS": "900", "BACKFILL_PRESIGN_DEFAULT_SECONDS": "300"})
def test_the_operator_caps_link_lifetimes_below_s3s_seven_days(api: LiveServer, backend: Backend) -> None:
    if backend.name != "postgres":
        pytest.skip("presigned links need S3")
    key = make_key("acme")
    source = upload(api.client(key), to_jsonl([chat_line(0)]))
    auth = {"Authorization": f"Bearer {key}"}
    capped = httpx.get(f"{api.base_url}/v1/files/{source.id}/content_url?expires_in=901", headers=auth)
    assert capped.status_code == 400 and "900" in capped.json()["error"]["message"]
    assert httpx.get(f"{api.base_url}/v1/files/{source.id}/content_url", headers=auth).json()["expires_in"] == 300


def test_files_stored_under_the_old_flat_keys_still_download_and_run(api: LiveServer) -> None:
    """Rows keep their own key: an object written as `files/{id}` before the layout changed still reads."""
    key = make_key("acme")
    client = api.client(key)
    data = to_jsonl([chat_line(i) for i in range(3)])
    placed = upload(client, data)
    old_key = f"files/{placed.id}"
    get_blob_store().put_stream(old_key, [data])
    with transaction() as session:
        row = session.get(File, placed.id)
        assert row is not None
        get_blob_store().delete(row.blob_key)
        row.blob_key = old_key
    assert client.files.content(placed.id).content == data
    batch = client.batches.create(input_file_id=placed.id, endpoint="/v1/chat/completions", completion_window="24h")
    done = wait_for(client, batch.id)
    assert done.status == "completed" and len(read_lines(client, done.output_file_id)) == 3
    for line in read_lines(client, done.output_file_id):
        BatchResultLine.model_validate(line)


def test_a_deleted_message_batch_leaves_no_manifest_cost_or_link(api: LiveServer, backend: Backend) -> None:
    import anthropic

    key = make_key("acme")
    headers = {"Authorization": f"Bearer {key}"}
    client = anthropic.Anthropic(api_key=key, base_url=api.base_url, max_retries=0, timeout=60)
    request = {"model": "fake-model", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}
    batch = client.messages.batches.create(requests=[{"custom_id": "a", "params": request}])  # type: ignore[list-item]
    for _ in range(600):
        if client.messages.batches.retrieve(batch.id).processing_status == "ended":
            break
        time.sleep(0.1)
    with transaction() as session:
        row = session.get(Batch, batch.id)
        assert row is not None and row.manifest_key is not None
        manifest = row.manifest_key
    assert httpx.get(f"{api.base_url}/v1/batches/{batch.id}/manifest", headers=headers).status_code == 200

    client.messages.batches.delete(batch.id)
    for path in ("manifest", "manifest_url", "cost"):
        answer = httpx.get(f"{api.base_url}/v1/batches/{batch.id}/{path}", headers=headers)
        assert answer.status_code == 404, (path, answer.text)
        assert answer.json()["error"]["code"] == "batch_not_found"
    with pytest.raises(Exception):  # noqa: B017 - the object itself is gone from the bucket
        object_bytes(manifest)


def test_deleting_an_ended_batchs_input_file_nulls_its_key_in_the_manifest(api: LiveServer) -> None:
    key = make_key("acme")
    client, done = run_batch(api, key, [chat_line(0)])
    headers = {"Authorization": f"Bearer {key}"}
    before = httpx.get(f"{api.base_url}/v1/batches/{done.id}/manifest", headers=headers).json()
    assert before["input_file"]["key"] is not None

    client.files.delete(done.input_file_id)
    after = httpx.get(f"{api.base_url}/v1/batches/{done.id}/manifest", headers=headers).json()
    assert after["input_file"] == {"file_id": done.input_file_id, "key": None, "bytes": None, "sha256": None}
    assert after["output"] == before["output"]  # the rest is as finalize wrote it
    with transaction() as session:
        row = session.get(Batch, done.id)
        assert row is not None and row.manifest_key is not None
        assert json.loads(object_bytes(row.manifest_key)) == after

    client.files.delete(done.output_file_id)  # a result file deleted by hand: its entry loses its key too
    after = httpx.get(f"{api.base_url}/v1/batches/{done.id}/manifest", headers=headers).json()
    assert after["output"]["key"] is None and after["output"]["file_id"] == done.output_file_id
