"""Objects in S3 (or MinIO, or moto) through boto3: multipart uploads with checksums."""

from __future__ import annotations

import base64
import hashlib
from collections import deque
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from storage.files.blobs import StoredBlob
from storage.files.blobs.layout import content_type
from storage.metrics.events import count_s3_error

_S3_ERRORS = (BotoCoreError, ClientError)
PARTS_IN_FLIGHT = 4  # parts being sent while the next is read: ~5 parts (40 MiB at 8 MiB) per upload


class S3BlobStore:
    """Uploads buffer one part at a time (bounded memory); each part carries a SHA-256 checksum."""

    def __init__(
        self,
        *,
        bucket: str,
        endpoint_url: str | None,
        region: str = "us-east-1",
        multipart_threshold: int = 16 * 1024 * 1024,
        client: Any = None,
    ) -> None:
        self.bucket = bucket
        self.part_bytes = multipart_threshold
        self.client = client or boto3.client(
            "s3",
            endpoint_url=endpoint_url,
            region_name=region,
            # Each body carries its own SHA-256 in a signed x-amz-checksum-sha256 header that S3 checks, so the
            # signature need not hash the body a second time (botocore does, over plain HTTP, unless told).
            config=Config(
                retries={"max_attempts": 5, "mode": "standard"},
                signature_version="s3v4",
                s3={"payload_signing_enabled": False},
            ),
        )

    def ensure_bucket(self) -> None:
        """Create the bucket if it does not exist (development and tests)."""
        try:
            self.client.head_bucket(Bucket=self.bucket)
        except ClientError:
            self.client.create_bucket(Bucket=self.bucket)

    def put_stream(self, key: str, chunks: Iterable[bytes]) -> StoredBlob:
        """Upload chunks to `key`: one PUT if small, else a multipart upload whose parts go out while the next
        ones are read (at most `PARTS_IN_FLIGHT` parts sent at once, so memory stays a few parts)."""
        digest = hashlib.sha256()
        size = 0
        held = _Held()
        upload_id: str | None = None
        sending: deque[Future[dict[str, Any]]] = deque()
        parts: list[dict[str, Any]] = []
        pool = ThreadPoolExecutor(max_workers=PARTS_IN_FLIGHT, thread_name_prefix="s3-part")
        try:
            number = 0
            for chunk in chunks:
                digest.update(chunk)
                size += len(chunk)
                held.add(chunk)
                while held.size >= self.part_bytes:
                    if upload_id is None:
                        upload_id = self.client.create_multipart_upload(
                            Bucket=self.bucket, Key=key, ChecksumAlgorithm="SHA256", ContentType=content_type(key)
                        )["UploadId"]
                    part = held.take(self.part_bytes)
                    if len(sending) >= PARTS_IN_FLIGHT:
                        parts.append(sending.popleft().result())
                    number += 1
                    sending.append(pool.submit(self._upload_part, key, upload_id, number, part))
            if upload_id is None:
                body = held.take(held.size)
                self.client.put_object(
                    Bucket=self.bucket,
                    Key=key,
                    Body=body,
                    ChecksumSHA256=_b64sha(body),
                    ContentType=content_type(key),
                )
            else:
                if held.size or number == 0:
                    number += 1
                    sending.append(pool.submit(self._upload_part, key, upload_id, number, held.take(held.size)))
                while sending:
                    parts.append(sending.popleft().result())
                self.client.complete_multipart_upload(
                    Bucket=self.bucket, Key=key, UploadId=upload_id, MultipartUpload={"Parts": parts}
                )
        except BaseException as error:
            if isinstance(error, _S3_ERRORS):
                count_s3_error("put")
            for future in sending:
                future.cancel()
            pool.shutdown(wait=True)  # no part may land after the abort
            if upload_id is not None:
                self.client.abort_multipart_upload(Bucket=self.bucket, Key=key, UploadId=upload_id)
            raise
        finally:
            pool.shutdown(wait=True)
        return StoredBlob(key=key, size=size, sha256=digest.hexdigest())

    def _upload_part(self, key: str, upload_id: str, number: int, data: bytes) -> dict[str, Any]:
        checksum = _b64sha(data)
        response = self.client.upload_part(
            Bucket=self.bucket,
            Key=key,
            UploadId=upload_id,
            PartNumber=number,
            Body=data,
            ChecksumSHA256=checksum,
        )
        return {"PartNumber": number, "ETag": response["ETag"], "ChecksumSHA256": checksum}

    def open_stream(self, key: str, *, chunk_bytes: int = 1024 * 1024) -> Iterator[bytes]:
        """Yield the object in chunks of at most `chunk_bytes`."""
        try:
            body = self.client.get_object(Bucket=self.bucket, Key=key)["Body"]
        except _S3_ERRORS:
            count_s3_error("get")
            raise
        try:
            yield from body.iter_chunks(chunk_size=chunk_bytes)
        except _S3_ERRORS:
            count_s3_error("get")
            raise
        finally:
            body.close()

    def presign(self, key: str, *, expires_seconds: int = 3600) -> str | None:
        """A time-limited GET URL for people fetching results straight from S3."""
        try:
            url: str = self.client.generate_presigned_url(
                "get_object", Params={"Bucket": self.bucket, "Key": key}, ExpiresIn=expires_seconds
            )
        except _S3_ERRORS:
            count_s3_error("presign")
            raise
        return url

    def delete(self, key: str) -> None:
        """Remove the object (S3 deletes are idempotent)."""
        try:
            self.client.delete_object(Bucket=self.bucket, Key=key)
        except _S3_ERRORS:
            count_s3_error("delete")
            raise

    def exists(self, key: str) -> bool:
        """True if the object is stored."""
        try:
            self.client.head_object(Bucket=self.bucket, Key=key)
        except ClientError as error:
            if error.response.get("Error", {}).get("Code") not in ("404", "NoSuchKey", "NotFound"):
                count_s3_error("head")
            return False
        return True


class _Held:
    """The chunks read but not yet sent, cut into parts with one copy each (a part is joined once; only the
    chunk that straddles a part's end is split, as views)."""

    def __init__(self) -> None:
        self.chunks: list[bytes | memoryview] = []
        self.size = 0

    def add(self, chunk: bytes) -> None:
        self.chunks.append(chunk)
        self.size += len(chunk)

    def take(self, wanted: int) -> bytes:
        """The first `wanted` bytes held (at most `size`), as one bytes object."""
        over = self.size - wanted  # bytes of the last chunk beyond the part (less than that chunk: see add)
        if over <= 0:
            part, self.chunks, self.size = b"".join(self.chunks), [], 0
            return part
        last = memoryview(self.chunks[-1])
        cut = len(last) - over
        part = b"".join([*self.chunks[:-1], last[:cut]])
        self.chunks, self.size = [last[cut:]], over
        return part


def _b64sha(data: bytes | bytearray) -> str:
    return base64.b64encode(hashlib.sha256(data).digest()).decode()
