"""Object storage behind one small protocol (store.py): S3 (boto3) or a local folder, picked by the settings."""

from __future__ import annotations

import logging
from functools import lru_cache

from sqlalchemy import event
from sqlalchemy.orm import Session

from storage.files.blobs.store import (
    BlobStore,
    PartsGone,
    PartSizeMismatch,
    PartsOutOfOrder,
    StoredBlob,
    StoredPart,
)

__all__ = [
    "BlobStore",
    "PartSizeMismatch",
    "PartsGone",
    "PartsOutOfOrder",
    "StoredBlob",
    "StoredPart",
    "delete_on_rollback",
    "get_blob_store",
]

log = logging.getLogger(__name__)


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
