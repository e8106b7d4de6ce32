"""Objects in S3 (or MinIO, or moto) through boto3: multipart uploads with checksums."""

from __future__ import annotations

import base64
import hashlib
import tempfile
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from functools import cached_property
from typing import Any

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError, HTTPClientError

from storage.files.blobs.layout import content_type
from storage.files.blobs.store import PartsGone, PartSizeMismatch, PartsOutOfOrder, StoredBlob, StoredPart
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
        self._endpoint_url, self._region, self._injected = endpoint_url, region, client is not None
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

    @cached_property
    def _parts_client(self) -> Any:
        """The client that streams an Uploads part straight through: no checksum computed ahead of the body (over
        plain HTTP botocore would read the whole body first to put a CRC32 in a header) and no retry (the body
        cannot be sent twice: a failed part is the client's to send again)."""
        if self._injected:
            return self.client
        return boto3.client(
            "s3",
            endpoint_url=self._endpoint_url,
            region_name=self._region,
            config=Config(
                retries={"total_max_attempts": 1, "mode": "standard"},
                signature_version="s3v4",
                s3={"payload_signing_enabled": False},
                request_checksum_calculation="when_required",
            ),
        )

    def start_parts(self, key: str) -> str:
        """Open an S3 multipart upload at `key`; its UploadId."""
        try:
            upload_id: str = self.client.create_multipart_upload(
                Bucket=self.bucket, Key=key, ContentType=content_type(key)
            )["UploadId"]
        except _S3_ERRORS:
            count_s3_error("put")
            raise
        return upload_id

    def put_part(
        self, key: str, upload_id: str, number: int, chunks: Iterable[bytes], *, size: int | None
    ) -> StoredPart:
        """UploadPart with the body streamed through as it arrives (`size`: its exact length, which S3 needs up
        front); with no size known, the part is spooled to a temporary file first (memory stays bounded)."""
        if size is None:
            with tempfile.SpooledTemporaryFile(max_size=8 * 1024 * 1024) as spool:
                for chunk in chunks:
                    spool.write(chunk)
                size = spool.tell()
                spool.seek(0)
                return self._stream_part(key, upload_id, number, spool, size)
        return self._stream_part(key, upload_id, number, _ExactBody(chunks, size), size)

    def _stream_part(self, key: str, upload_id: str, number: int, body: Any, size: int) -> StoredPart:
        try:
            response = self._parts_client.upload_part(
                Bucket=self.bucket, Key=key, UploadId=upload_id, PartNumber=number, Body=body, ContentLength=size
            )
        except HTTPClientError:
            failed = getattr(body, "failed", None)
            if failed is not None:  # the body's own failure (its size, the form, the client gone), as raised
                raise failed from None
            count_s3_error("put")
            raise
        except ClientError as error:
            if _code(error) == "NoSuchUpload":
                raise PartsGone(key) from None
            count_s3_error("put")
            raise
        except BotoCoreError:
            count_s3_error("put")
            raise
        return StoredPart(number=number, size=size, etag=response["ETag"])

    def finish_parts(self, key: str, upload_id: str, parts: Sequence[StoredPart]) -> None:
        """CompleteMultipartUpload with the listed parts: S3 joins them in place (no copy), and frees the others.
        S3 joins parts in the order of their numbers: PartsOutOfOrder if the list asks for another order."""
        numbers = [part.number for part in parts]
        if numbers != sorted(numbers):
            raise PartsOutOfOrder(key)
        listed = [{"PartNumber": part.number, "ETag": part.etag} for part in parts]
        try:
            self.client.complete_multipart_upload(
                Bucket=self.bucket, Key=key, UploadId=upload_id, MultipartUpload={"Parts": listed}
            )
        except ClientError as error:
            if _code(error) == "NoSuchUpload":
                raise PartsGone(key) from None
            count_s3_error("put")
            raise

    def abort_parts(self, key: str, upload_id: str) -> None:
        """AbortMultipartUpload: every part is freed (idempotent: an upload already gone is fine)."""
        try:
            self.client.abort_multipart_upload(Bucket=self.bucket, Key=key, UploadId=upload_id)
        except ClientError as error:
            if _code(error) != "NoSuchUpload":
                count_s3_error("delete")
                raise


def _code(error: ClientError) -> str:
    return str(error.response.get("Error", {}).get("Code", ""))


class _ExactBody:
    """A request body read from `chunks` that must hold exactly `size` bytes: botocore sends what `read` returns.

    The last bytes are handed over only once `chunks` is known to end there (the form's closing boundary read),
    and a body that ends short or runs long raises PartSizeMismatch before S3 has the whole part: S3 stores a part
    only once its Content-Length arrived, so a wrong body never becomes a part.
    """

    def __init__(self, chunks: Iterable[bytes], size: int) -> None:
        self._chunks = (chunk for chunk in chunks if chunk)
        self._size = size
        self._taken = 0  # bytes moved from `chunks` into the buffer
        self._buffer = memoryview(b"")
        self.failed: Exception | None = None

    def read(self, amount: int | None = -1) -> bytes:
        try:
            if not self._buffer and not self._refill():
                return b""
        except Exception as error:  # botocore wraps it in HTTPClientError: kept to be raised as it is
            self.failed = error
            raise
        wanted = len(self._buffer) if amount is None or amount < 0 else amount
        piece, self._buffer = self._buffer[:wanted], self._buffer[wanted:]
        return bytes(piece)

    def _refill(self) -> bool:
        chunk = next(self._chunks, None)
        if chunk is None:
            if self._taken != self._size:
                raise PartSizeMismatch(f"the part ended at {self._taken} of its {self._size} bytes")
            return False
        self._taken += len(chunk)
        if self._taken > self._size:
            raise PartSizeMismatch(f"the part ran past its {self._size} bytes")
        if self._taken == self._size and next(self._chunks, None) is not None:
            raise PartSizeMismatch(f"the part ran past its {self._size} bytes")
        self._buffer = memoryview(chunk)
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
