"""Object storage behind one small protocol: S3 (boto3) or a local folder."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from functools import lru_cache
from typing import Protocol


@dataclass(frozen=True)
class StoredBlob:
    """What a finished upload left behind: its size and SHA-256."""

    key: str
    size: int
    sha256: str


class BlobStore(Protocol):
    """Stream objects in and out in bounded chunks; never hold a whole object in memory."""

    def put_stream(self, key: str, chunks: Iterable[bytes]) -> StoredBlob: ...

    def open_stream(self, key: str, *, chunk_bytes: int = 1024 * 1024) -> Iterator[bytes]: ...

    def presign(self, key: str, *, expires_seconds: int = 3600) -> str | None: ...

    def delete(self, key: str) -> None: ...

    def exists(self, key: str) -> bool: ...


@lru_cache(maxsize=1)
def get_blob_store() -> BlobStore:
    """S3 when BACKFILL_S3_ENDPOINT_URL or BACKFILL_S3_BUCKET is set, else a folder under data_dir."""
    from storage.settings import get_settings

    settings = get_settings()
    if settings.s3_bucket:
        from storage.blobs.s3 import S3BlobStore

        return S3BlobStore(
            bucket=settings.s3_bucket,
            endpoint_url=settings.s3_endpoint_url,
            region=settings.s3_region,
            multipart_threshold=settings.s3_multipart_threshold_bytes,
        )
    from storage.blobs.local import LocalBlobStore

    return LocalBlobStore(settings.data_dir / "objects")
