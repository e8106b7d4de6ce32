"""An object written before its row never outlives a rollback; an interrupted multipart upload is aborted."""

from __future__ import annotations

import pytest

from storage.db import transaction
from storage.files.blobs import get_blob_store
from storage.files.files import create_file
from storage.tenants import get_or_create_tenant
from tests.conftest import Backend


def test_an_upload_whose_transaction_rolls_back_removes_its_object(backend: Backend) -> None:
    store = get_blob_store()
    keys = []
    with pytest.raises(RuntimeError), transaction() as session:
        tenant = get_or_create_tenant(session, name="acme")
        row = create_file(session, store, tenant_id=tenant.id, filename="a.jsonl", purpose="batch", chunks=[b"{}\n"])
        keys.append(row.blob_key)
        assert store.exists(row.blob_key)
        raise RuntimeError("the commit never happens (a locked database, a lost connection)")
    assert not store.exists(keys[0])


def test_a_committed_upload_keeps_its_object(backend: Backend) -> None:
    store = get_blob_store()
    with transaction() as session:
        tenant = get_or_create_tenant(session, name="acme")
        row = create_file(session, store, tenant_id=tenant.id, filename="a.jsonl", purpose="batch", chunks=[b"{}\n"])
    assert store.exists(row.blob_key)


def test_an_upload_interrupted_mid_multipart_is_aborted(backend: Backend) -> None:
    if backend.name != "postgres":
        pytest.skip("multipart uploads are an S3 matter")
    store = get_blob_store()

    def chunks():  # type: ignore[no-untyped-def]
        yield b"x" * (6 * 1024 * 1024)  # past the 5 MiB part size: a multipart upload is open
        yield b"y" * (6 * 1024 * 1024)
        raise ConnectionResetError("the client went away")

    store.part_bytes = 5 * 1024 * 1024  # type: ignore[attr-defined]
    client, bucket = store.client, store.bucket  # type: ignore[attr-defined]
    before = client.list_objects_v2(Bucket=bucket).get("Contents", [])
    # the bucket outlives one test, and the Uploads API keeps its uploads open until they complete or expire
    open_before = {u["UploadId"] for u in client.list_multipart_uploads(Bucket=bucket).get("Uploads", [])}
    with pytest.raises(ConnectionResetError), transaction() as session:
        tenant = get_or_create_tenant(session, name="acme")
        create_file(session, store, tenant_id=tenant.id, filename="a.jsonl", purpose="batch", chunks=chunks())
    open_after = {u["UploadId"] for u in client.list_multipart_uploads(Bucket=bucket).get("Uploads", [])}
    assert open_after - open_before == set()
    assert client.list_objects_v2(Bucket=bucket).get("Contents", []) == before
