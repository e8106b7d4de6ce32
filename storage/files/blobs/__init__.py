"""Object storage behind one small protocol: S3 (boto3) or a local folder."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Protocol

from sqlalchemy import event
from sqlalchemy.orm import Session

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StoredBlob:
    """What a finished upload left behind: its size and SHA-256."""

    key: str
    size: int
    sha256: str


@dataclass(frozen=True)
class StoredPart:
    """One part of a multipart object as the store holds it: its number (1..10,000), size and ETag."""

    number: int
    size: int
    etag: str


class PartsGone(Exception):
    """The store no longer holds the multipart upload: it was completed or aborted (a cancel, an expiry)."""


class PartSizeMismatch(ValueError):
    """A part's bytes ended before, or ran past, the size announced for it (nothing of it is stored)."""


class PartsOutOfOrder(Exception):
    """The store assembles parts in the order of their numbers, and the order asked for is another."""


class BlobStore(Protocol):
    """Stream objects in and out in bounded chunks; never hold a whole object in memory.

    Multipart objects (the Uploads API) are written part by part: `start_parts` opens one at its final key,
    `put_part` stores each part as it streams in, `finish_parts` makes the listed parts the object without
    copying them, and `abort_parts` removes every part (idempotent).
    """

    def put_stream(self, key: str, chunks: Iterable[bytes]) -> StoredBlob: ...

    def open_stream(self, key: str, *, chunk_bytes: int = 1024 * 1024) -> Iterator[bytes]: ...

    def presign(self, key: str, *, expires_seconds: int = 3600) -> str | None: ...

    def delete(self, key: str) -> None: ...

    def exists(self, key: str) -> bool: ...

    def start_parts(self, key: str) -> str: ...

    def put_part(
        self, key: str, upload_id: str, number: int, chunks: Iterable[bytes], *, size: int | None
    ) -> StoredPart: ...

    def finish_parts(self, key: str, upload_id: str, parts: Sequence[StoredPart]) -> None: ...

    def abort_parts(self, key: str, upload_id: str) -> None: ...


@lru_cache(maxsize=1)
def get_blob_store() -> BlobStore:
    """S3 when BACKFILL_S3_ENDPOINT_URL or BACKFILL_S3_BUCKET is set, else a folder under data_dir."""
    from storage.settings import get_settings

    settings = get_settings()
    if settings.s3_bucket:
        from storage.files.blobs.s3 import S3BlobStore

        return S3BlobStore(
            bucket=settings.s3_bucket,
            endpoint_url=settings.s3_endpoint_url,
            region=settings.s3_region,
            multipart_threshold=settings.s3_multipart_threshold_bytes,
        )
    from storage.files.blobs.local import LocalBlobStore

    return LocalBlobStore(settings.data_dir / "objects")


_PENDING = "backfill_blobs_pending"


def delete_on_rollback(session: Session, blobs: BlobStore, key: str, *, upload_id: str | None = None) -> None:
    """Remove the object at `key` if `session` rolls back: an object written before its row never outlives it.
    With `upload_id`, the multipart object opened there is aborted instead (every part it holds removed)."""
    session.info.setdefault(_PENDING, []).append((blobs, key, upload_id))


@event.listens_for(Session, "after_commit")
def _keep(session: Session) -> None:
    session.info.pop(_PENDING, None)


@event.listens_for(Session, "after_rollback")
def _remove(session: Session) -> None:
    for blobs, key, upload_id in session.info.pop(_PENDING, []):
        try:
            if upload_id is None:
                blobs.delete(key)
            else:
                blobs.abort_parts(key, upload_id)
        except Exception:  # the orphan stays; a lifecycle rule or an operator removes it
            log.exception("could not remove the object %s of a rolled-back upload", key)
