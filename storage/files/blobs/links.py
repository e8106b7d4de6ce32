"""Presigned, time-limited GET links to objects, for people who fetch results without the API."""

from __future__ import annotations

from dataclasses import dataclass

from storage.clock import now
from storage.errors import InvalidRequest, LinksUnavailable
from storage.files.blobs import BlobStore

S3_MAX_EXPIRY_SECONDS = 7 * 24 * 3600  # SigV4 presigned URLs are valid for at most 7 days


@dataclass(frozen=True)
class Link:
    """A URL that reads one object until `expires_at` (unix seconds)."""

    key: str
    url: str
    expires_in: int
    expires_at: int


def presigned_link(blobs: BlobStore, *, key: str, expires_in: int, max_seconds: int) -> Link:
    """A GET link to `key` valid for `expires_in` seconds (at most `max_seconds`, at most 7 days)."""
    limit = min(max_seconds, S3_MAX_EXPIRY_SECONDS)
    if not 1 <= expires_in <= limit:
        raise InvalidRequest(f"expires_in must be between 1 and {limit} seconds.", param="expires_in")
    url = blobs.presign(key, expires_seconds=expires_in)
    if url is None:
        raise LinksUnavailable(
            "Presigned URLs are not available: this server keeps objects in a local folder, which has no URLs "
            "of its own. Download through GET /v1/files/{file_id}/content, or configure S3 "
            "(BACKFILL_S3_BUCKET).",
            param=None,
        )
    return Link(key=key, url=url, expires_in=expires_in, expires_at=now() + expires_in)
