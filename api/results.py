"""Backfill extensions for people who read results straight from object storage (docs/operations.md).

Presigned, time-limited links to a file's object and to a batch's manifest.json, and the manifest itself.
Links need S3; on the local-folder store they answer `presigned_urls_unavailable` (download through
`GET /v1/files/{id}/content` instead).
"""

from __future__ import annotations

from typing import Annotated, Any

import orjson
from fastapi import APIRouter, Query

from api.deps import Blobs, Caller, Config, DbSession
from storage.batches.manifests import manifest_key
from storage.files.blobs.links import S3_MAX_EXPIRY_SECONDS, Link, presigned_link
from storage.files.files import get_file

router = APIRouter()

ExpiresIn = Annotated[int | None, Query(ge=1, le=S3_MAX_EXPIRY_SECONDS, description="seconds the link stays valid")]


def _link(link: Link, **fields: Any) -> dict[str, Any]:
    return {**fields, "key": link.key, "url": link.url, "expires_in": link.expires_in, "expires_at": link.expires_at}


@router.get("/v1/files/{file_id}/content_url", tags=["files"], response_model=dict[str, Any])
def file_content_url(
    file_id: str, session: DbSession, caller: Caller, blobs: Blobs, settings: Config, expires_in: ExpiresIn = None
) -> dict[str, Any]:
    """Backfill extension: a presigned GET URL for the file's object, valid for `expires_in` seconds
    (default BACKFILL_PRESIGN_DEFAULT_SECONDS, at most BACKFILL_PRESIGN_MAX_SECONDS and 7 days)."""
    row = get_file(session, tenant_id=caller.tenant_id, file_id=file_id)
    link = presigned_link(
        blobs,
        key=row.blob_key,
        expires_in=expires_in or settings.presign_default_seconds,
        max_seconds=settings.presign_max_seconds,
    )
    return _link(link, object="file.content_url", file_id=row.id, bytes=row.bytes, sha256=row.sha256 or None)


@router.get("/v1/batches/{batch_id}/manifest", tags=["batches"], response_model=dict[str, Any])
def batch_manifest(batch_id: str, session: DbSession, caller: Caller, blobs: Blobs) -> dict[str, Any]:
    """Backfill extension: the batch's manifest.json (objects, sizes, SHA-256, counts, cost), once it ended."""
    key = manifest_key(session, tenant_id=caller.tenant_id, batch_id=batch_id)
    manifest: dict[str, Any] = orjson.loads(b"".join(blobs.open_stream(key)))
    return manifest


@router.get("/v1/batches/{batch_id}/manifest_url", tags=["batches"], response_model=dict[str, Any])
def batch_manifest_url(
    batch_id: str, session: DbSession, caller: Caller, blobs: Blobs, settings: Config, expires_in: ExpiresIn = None
) -> dict[str, Any]:
    """Backfill extension: a presigned GET URL for the batch's manifest.json, valid for `expires_in` seconds."""
    key = manifest_key(session, tenant_id=caller.tenant_id, batch_id=batch_id)
    link = presigned_link(
        blobs,
        key=key,
        expires_in=expires_in or settings.presign_default_seconds,
        max_seconds=settings.presign_max_seconds,
    )
    return _link(link, object="batch.manifest_url", batch_id=batch_id)
