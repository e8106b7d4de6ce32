"""Object storage: S3 (moto over HTTP) and the local folder behave the same and stream in bounded chunks."""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from storage.files.blobs import BlobStore, PartsGone, PartSizeMismatch, PartsOutOfOrder
from storage.files.blobs.local import LocalBlobStore
from storage.files.blobs.s3 import S3BlobStore

MIB = 1024 * 1024


@pytest.fixture(params=["local", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> BlobStore:
    if request.param == "local":
        return LocalBlobStore(tmp_path / "objects")
    endpoint = request.getfixturevalue("moto_endpoint")
    s3 = S3BlobStore(bucket="blob-test", endpoint_url=endpoint, multipart_threshold=5 * MIB)
    s3.ensure_bucket()
    return s3


def chunks(total: int, size: int = 256 * 1024) -> Iterator[bytes]:
    block = hashlib.sha256(b"seed").digest() * (size // 32)
    sent = 0
    while sent < total:
        piece = block[: min(size, total - sent)]
        sent += len(piece)
        yield piece


def test_round_trip_large_object_in_bounded_chunks(store: BlobStore) -> None:
    total = 12 * MIB + 123  # several multipart parts on S3
    digest = hashlib.sha256(b"".join(chunks(total))).hexdigest()
    stored = store.put_stream("files/big", chunks(total))
    assert stored.size == total and stored.sha256 == digest
    seen = hashlib.sha256()
    largest = 0
    for piece in store.open_stream("files/big", chunk_bytes=MIB):
        largest = max(largest, len(piece))
        seen.update(piece)
    assert seen.hexdigest() == digest and largest <= MIB


def test_failed_upload_leaves_no_object(store: BlobStore) -> None:
    def broken() -> Iterator[bytes]:
        yield from chunks(6 * MIB)
        raise RuntimeError("client went away")

    with pytest.raises(RuntimeError):
        store.put_stream("files/broken", broken())
    assert not store.exists("files/broken")


def test_delete_and_empty_objects(store: BlobStore) -> None:
    store.put_stream("files/empty", iter([]))
    assert store.exists("files/empty") and b"".join(store.open_stream("files/empty")) == b""
    store.delete("files/empty")
    store.delete("files/empty")  # idempotent
    assert not store.exists("files/empty")


def test_s3_objects_say_what_they_hold(moto_endpoint: str) -> None:
    """Issue 19 bug 8: objects were stored as binary/octet-stream; a browser or a bucket console reading them
    sees JSONL and JSON, whether the object went up in one PUT or in parts."""
    s3 = S3BlobStore(bucket="blob-types", endpoint_url=moto_endpoint, multipart_threshold=5 * MIB)
    s3.ensure_bucket()
    keys = {
        "acme/files/file-1.jsonl": (b'{"a": 1}\n', "application/jsonl"),
        "acme/batches/batch_1/output.jsonl": (b"".join(chunks(6 * MIB)), "application/jsonl"),  # multipart
        "acme/batches/batch_1/manifest.json": (b"{}\n", "application/json"),
    }
    for key, (data, _) in keys.items():
        s3.put_stream(key, [data])
    seen = {key: s3.client.head_object(Bucket="blob-types", Key=key)["ContentType"] for key in keys}
    assert seen == {key: kind for key, (_, kind) in keys.items()}


def test_parts_become_the_object_in_place_and_only_the_listed_ones(store: BlobStore) -> None:
    """The Uploads API's parts: streamed in with their exact size, joined by the store without a copy."""
    key = f"acme/files/file-{uuid.uuid4().hex[:8]}.jsonl"
    upload_id = store.start_parts(key)
    first = store.put_part(key, upload_id, 1, chunks(5 * MIB), size=5 * MIB)
    store.put_part(key, upload_id, 2, chunks(MIB), size=MIB)  # sent again below: not listed, so not kept
    last = store.put_part(key, upload_id, 3, iter([b"tail\n"]), size=None)  # no size known: spooled on S3
    assert not store.exists(key)  # parts are not an object yet
    store.finish_parts(key, upload_id, [first, last])
    assert b"".join(store.open_stream(key)) == b"".join(chunks(5 * MIB)) + b"tail\n"
    if isinstance(store, LocalBlobStore):  # S3 may answer a repeated complete with success
        with pytest.raises(PartsGone):
            store.finish_parts(key, upload_id, [first, last])
    store.delete(key)
    assert not store.exists(key)


def test_a_part_of_the_wrong_size_is_not_stored(store: BlobStore) -> None:
    key = f"acme/files/file-{uuid.uuid4().hex[:8]}.jsonl"
    upload_id = store.start_parts(key)
    for sent in (MIB - 1, MIB + 1):
        with pytest.raises(PartSizeMismatch):
            store.put_part(key, upload_id, 1, chunks(sent), size=MIB)
    good = store.put_part(key, upload_id, 2, chunks(10), size=10)
    store.finish_parts(key, upload_id, [good])
    assert b"".join(store.open_stream(key)) == b"".join(chunks(10))


def test_aborted_parts_are_gone_and_a_late_part_finds_no_upload(store: BlobStore) -> None:
    key = f"acme/files/file-{uuid.uuid4().hex[:8]}.jsonl"
    upload_id = store.start_parts(key)
    store.put_part(key, upload_id, 1, chunks(MIB), size=MIB)
    store.abort_parts(key, upload_id)
    store.abort_parts(key, upload_id)  # idempotent
    assert not store.exists(key)
    if isinstance(store, LocalBlobStore):  # S3 (moto) answers a part of an aborted upload with an error of its own
        with pytest.raises(PartsGone):
            store.put_part(key, upload_id, 2, chunks(10), size=10)
        assert not (store.root / key).exists()


def test_the_local_store_joins_parts_in_any_order_and_s3_in_arrival_order(store: BlobStore) -> None:
    key = f"acme/files/file-{uuid.uuid4().hex[:8]}.jsonl"
    upload_id = store.start_parts(key)
    late = store.put_part(key, upload_id, 1, [b"b" * (5 * MIB)], size=5 * MIB)
    early = store.put_part(key, upload_id, 2, [b"a" * (5 * MIB)], size=5 * MIB)
    if isinstance(store, LocalBlobStore):
        store.finish_parts(key, upload_id, [early, late])
        assert b"".join(store.open_stream(key)) == b"a" * (5 * MIB) + b"b" * (5 * MIB)
    else:
        with pytest.raises(PartsOutOfOrder):
            store.finish_parts(key, upload_id, [early, late])
        store.abort_parts(key, upload_id)
