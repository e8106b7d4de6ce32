"""Uploads: a file of up to 8 GB sent in parts of up to 64 MB (OpenAI's Uploads API, `client.uploads`)."""

from __future__ import annotations

from fastapi import APIRouter, Request

from api.bodies import body_chunks
from api.deps import Blobs, Caller, Config, DbSession
from api.multipart import FormStream, missing
from api.openai.files import PURPOSES
from api.openai.schemas import UploadComplete, UploadCreate, UploadObject, UploadPartObject
from storage.errors import ChecksumMismatch, InvalidRequest
from storage.files.uploads import cancel_upload, complete_upload, create_upload, put_part, start_part
from storage.lines.reader import clip

router = APIRouter(prefix="/v1/uploads", tags=["uploads"])

_PART_FORM = {
    "type": "object",
    "required": ["data"],
    "properties": {"data": {"type": "string", "contentMediaType": "application/octet-stream", "title": "Data"}},
}


@router.post("", response_model=UploadObject)
def create(body: UploadCreate, session: DbSession, caller: Caller, blobs: Blobs, settings: Config) -> UploadObject:
    """Create an Upload of `bytes` bytes (at most BACKFILL_UPLOAD_TOTAL_MAX_BYTES, 8 GB); add its parts within an
    hour (BACKFILL_UPLOAD_EXPIRES_SECONDS), then complete it. A pending upload counts against the tenant's file
    quotas with its declared size."""
    if body.purpose not in PURPOSES:
        raise InvalidRequest(f"Invalid purpose {clip(body.purpose)}: uploads support 'batch'.", param="purpose")
    upload = create_upload(
        session,
        blobs,
        settings,
        tenant_id=caller.tenant_id,
        size=body.bytes,
        filename=body.filename,
        purpose=body.purpose,
        mime_type=body.mime_type,
        file_expires_after_seconds=(
            body.expires_after.seconds if body.expires_after else settings.batch_file_expires_seconds or None
        ),
    )
    return UploadObject.of(upload)


@router.post(
    "/{upload_id}/parts",
    response_model=UploadPartObject,
    openapi_extra={"requestBody": {"required": True, "content": {"multipart/form-data": {"schema": _PART_FORM}}}},
)
def add_part(
    upload_id: str, request: Request, session: DbSession, caller: Caller, blobs: Blobs, settings: Config
) -> UploadPartObject:
    """Add a part (multipart form field `data`, at most BACKFILL_UPLOAD_PART_MAX_BYTES, 64 MB) to a pending Upload.

    The part streams straight into the object store as one part of the upload's multipart object while the client
    sends it (no spool file); parts may be sent in parallel. Parts are numbered in the order they arrive."""
    slot = start_part(session, tenant_id=caller.tenant_id, upload_id=upload_id)
    session.commit()  # no transaction (or pooled connection) is held while the part streams in
    body = body_chunks(request, gather_bytes=settings.stream_chunk_bytes)
    form = FormStream(request.headers.get("content-type", ""), body, file_field="data", keep=())
    if not form.read_to_file():
        raise missing("data")
    declared = request.headers.get("content-length", "")
    size = form.file_size(int(declared) if declared.isdigit() else None)
    part = put_part(session, blobs, settings, slot, chunks=form.file_chunks(), size=size)
    return UploadPartObject.of(part)


@router.post("/{upload_id}/complete", response_model=UploadObject)
def complete(
    upload_id: str, body: UploadComplete, session: DbSession, caller: Caller, blobs: Blobs, settings: Config
) -> UploadObject:
    """Complete a pending Upload: the listed parts, in the listed order, become a File (in place: nothing is copied).
    Their sizes must add up to the upload's `bytes`, and every part but the last must hold at least 5 MiB (object
    storage's multipart minimum). With `md5`, the file is read once to check it; a mismatch cancels the upload."""
    try:
        upload, file = complete_upload(
            session,
            blobs,
            settings,
            tenant_id=caller.tenant_id,
            upload_id=upload_id,
            part_ids=body.part_ids,
            md5=body.md5,
        )
    except ChecksumMismatch:
        session.commit()  # the upload is cancelled and its object removed; the client is told why
        raise
    return UploadObject.of(upload, file)


@router.post("/{upload_id}/cancel", response_model=UploadObject)
def cancel(upload_id: str, session: DbSession, caller: Caller, blobs: Blobs) -> UploadObject:
    """Cancel a pending Upload: its parts are removed and no part may be added."""
    return UploadObject.of(cancel_upload(session, blobs, tenant_id=caller.tenant_id, upload_id=upload_id))
