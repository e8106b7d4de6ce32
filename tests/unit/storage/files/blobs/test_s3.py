"""The S3 store cuts any chunking into parts of the configured size, in order, each with its own SHA-256."""

from __future__ import annotations

import base64
import hashlib
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from storage.files.blobs.s3 import S3BlobStore

PART = 5 * 1024 * 1024


class FakeS3:
    """Records what the store sends, as S3 would keep it (parts may arrive out of order)."""

    def __init__(self) -> None:
        self.parts: dict[int, bytes] = {}
        self.objects: dict[str, bytes] = {}
        self.aborted = False
        self.lock = threading.Lock()

    def create_multipart_upload(self, **_: Any) -> dict[str, str]:
        return {"UploadId": "up-1"}

    def upload_part(self, *, PartNumber: int, Body: bytes, ChecksumSHA256: str, **_: Any) -> dict[str, str]:
        assert ChecksumSHA256 == base64.b64encode(hashlib.sha256(Body).digest()).decode()
        with self.lock:
            self.parts[PartNumber] = Body
        return {"ETag": f"e{PartNumber}"}

    def complete_multipart_upload(self, *, Key: str, MultipartUpload: dict[str, Any], **_: Any) -> None:
        numbers = [part["PartNumber"] for part in MultipartUpload["Parts"]]
        assert numbers == sorted(self.parts) == list(range(1, len(numbers) + 1))
        self.objects[Key] = b"".join(self.parts[number] for number in numbers)

    def abort_multipart_upload(self, **_: Any) -> None:
        self.aborted = True

    def put_object(self, *, Key: str, Body: bytes, **_: Any) -> None:
        self.objects[Key] = Body


def pieces(data: bytes, size: int) -> Iterator[bytes]:
    for start in range(0, len(data), size):
        yield data[start : start + size]


DATA = hashlib.sha256(b"seed").digest() * (3 * PART // 32 + 1000)  # three parts and a bit


@pytest.mark.parametrize("size", [1_000_003, 1 << 20, PART, 2 * PART + 7, len(DATA)])
def test_parts_are_the_configured_size_whatever_the_chunking(size: int) -> None:
    s3 = FakeS3()
    store = S3BlobStore(bucket="b", endpoint_url=None, multipart_threshold=PART, client=s3)
    stored = store.put_stream("k", pieces(DATA, size))
    assert s3.objects["k"] == DATA
    assert stored.size == len(DATA) and stored.sha256 == hashlib.sha256(DATA).hexdigest()
    assert [len(s3.parts[n]) for n in sorted(s3.parts)] == [PART, PART, PART, len(DATA) - 3 * PART]


def test_a_small_object_is_one_put() -> None:
    s3 = FakeS3()
    store = S3BlobStore(bucket="b", endpoint_url=None, multipart_threshold=PART, client=s3)
    store.put_stream("k", [b'{"a": 1}\n', b'{"b": 2}\n'])
    assert s3.objects == {"k": b'{"a": 1}\n{"b": 2}\n'} and not s3.parts


def test_a_stream_that_fails_after_some_parts_aborts_the_upload() -> None:
    def broken() -> Iterator[bytes]:
        yield from pieces(DATA[: 2 * PART + 10], 1 << 20)
        raise ConnectionError("client went away")

    s3 = FakeS3()
    store = S3BlobStore(bucket="b", endpoint_url=None, multipart_threshold=PART, client=s3)
    with pytest.raises(ConnectionError):
        store.put_stream("k", broken())
    assert s3.aborted and s3.objects == {}
