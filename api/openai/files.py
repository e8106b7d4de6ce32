"""Files: upload JSONL for batches, list, read, download, delete."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated, BinaryIO

from fastapi import APIRouter, Form, Query, UploadFile
from fastapi.responses import StreamingResponse

from api.deps import Blobs, Caller, Config, Cursor, DbSession
from api.openai.schemas import FileDeleted, FileList, FileObject
from api.paging import cursor_fields
from storage.errors import InvalidRequest, UploadTooLarge
from storage.files.files import check_filename, content_disposition, create_file, delete_file, get_file, list_files
from storage.lines.reader import check_utf8_jsonl, clip

router = APIRouter(prefix="/v1/files", tags=["files"])

PURPOSES = ("batch",)
EXPIRES_MIN_SECONDS, EXPIRES_MAX_SECONDS = 3600, 30 * 86400  # OpenAI's bounds for expires_after.seconds


def expiry_seconds(anchor: str | None, seconds: str | int | None, *, param: str) -> int | None:
    """OpenAI's `{anchor: "created_at", seconds: N}` checked (3600 <= N <= 2592000); None when not given."""
    if anchor is None and seconds is None:
        return None
    if anchor != "created_at":
        raise InvalidRequest(f"Invalid '{param}.anchor': only 'created_at' is supported.", param=f"{param}.anchor")
    text = str(seconds).strip() if seconds is not None else ""
    if not text.isdigit() or not EXPIRES_MIN_SECONDS <= int(text) <= EXPIRES_MAX_SECONDS:
        raise InvalidRequest(
            f"Invalid '{param}.seconds': must be an integer between {EXPIRES_MIN_SECONDS} and {EXPIRES_MAX_SECONDS}.",
            param=f"{param}.seconds",
        )
    return int(text)


def _bounded(handle: BinaryIO, *, limit: int, chunk_bytes: int) -> Iterator[bytes]:
    total = 0
    while chunk := handle.read(chunk_bytes):
        total += len(chunk)
        if total > limit:
            raise UploadTooLarge(f"File is larger than the {limit} byte limit.", param="file")
        yield chunk


@router.post("", response_model=FileObject)
def upload_file(
    file: UploadFile,
    purpose: Annotated[str, Form(json_schema_extra={"enum": list(PURPOSES)})],
    session: DbSession,
    caller: Caller,
    blobs: Blobs,
    settings: Config,
    expires_anchor: Annotated[str | None, Form(alias="expires_after[anchor]", max_length=32)] = None,
    expires_seconds: Annotated[str | None, Form(alias="expires_after[seconds]", max_length=16)] = None,
) -> FileObject:
    """Upload a JSONL file of batch requests (purpose `batch`); it is streamed to object storage.

    `expires_after={anchor: created_at, seconds: N}` (3600 <= N <= 2592000) sets when it expires; by default
    a batch file expires after 30 days (`BACKFILL_BATCH_FILE_EXPIRES_SECONDS`)."""
    if purpose not in PURPOSES:
        raise InvalidRequest(f"Invalid purpose {clip(purpose)}: uploads support 'batch'.", param="purpose")
    # Kept as the user's label, never used as a path: objects are keyed by file id alone.
    filename = check_filename(file.filename or "upload.jsonl")
    limit = settings.upload_max_bytes  # api/limits.py already refused a larger declared or streamed body
    expires = expiry_seconds(expires_anchor, expires_seconds, param="expires_after")
    if expires is None:
        expires = settings.batch_file_expires_seconds or None
    chunks = _bounded(file.file, limit=limit, chunk_bytes=settings.stream_chunk_bytes)
    try:
        row = create_file(
            session,
            blobs,
            tenant_id=caller.tenant_id,
            filename=filename,
            purpose=purpose,
            chunks=check_utf8_jsonl(chunks),
            expires_after_seconds=expires,
        )
    except ValueError as error:
        raise InvalidRequest(str(error), param="file", code="invalid_file_format") from None
    if row.bytes == 0:
        blobs.delete(row.blob_key)
        raise InvalidRequest("The file is empty.", param="file", code="empty_file")
    return FileObject.of(row)


@router.get("", response_model=FileList)
def list_all_files(
    session: DbSession,
    caller: Caller,
    purpose: Annotated[str | None, Query(max_length=64)] = None,
    after: Cursor = None,
    limit: Annotated[int, Query(ge=1, le=10000)] = 10000,
    order: Annotated[str, Query(pattern="^(asc|desc)$")] = "desc",
) -> FileList:
    """List the caller's files, newest first."""
    rows = list_files(session, tenant_id=caller.tenant_id, purpose=purpose, after=after, limit=limit, order=order)
    page = [FileObject.of(row) for row in rows[:limit]]
    return FileList(data=page, **cursor_fields(page, has_more=len(rows) > limit))


@router.get("/{file_id}", response_model=FileObject)
def retrieve_file(file_id: str, session: DbSession, caller: Caller) -> FileObject:
    """One file's metadata."""
    return FileObject.of(get_file(session, tenant_id=caller.tenant_id, file_id=file_id))


@router.get("/{file_id}/content")
def file_content(file_id: str, session: DbSession, caller: Caller, blobs: Blobs, settings: Config) -> StreamingResponse:
    """The file's bytes, streamed from object storage."""
    row = get_file(session, tenant_id=caller.tenant_id, file_id=file_id)
    stream = blobs.open_stream(row.blob_key, chunk_bytes=settings.stream_chunk_bytes)
    return StreamingResponse(
        stream,
        media_type="application/octet-stream",
        headers={"Content-Length": str(row.bytes), "Content-Disposition": content_disposition(row.filename)},
    )


@router.delete("/{file_id}", response_model=FileDeleted)
def remove_file(file_id: str, session: DbSession, caller: Caller, blobs: Blobs) -> FileDeleted:
    """Delete a file and its object."""
    row = delete_file(session, blobs, tenant_id=caller.tenant_id, file_id=file_id)
    return FileDeleted(id=row.id)
