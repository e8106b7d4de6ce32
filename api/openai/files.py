"""Files: upload JSONL for batches, list, read, download, delete."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Annotated

from fastapi import APIRouter, Query, Request
from fastapi.responses import StreamingResponse

from api.bodies import body_chunks
from api.deps import Blobs, Caller, Config, Cursor, DbSession
from api.multipart import FormStream, missing
from api.openai.schemas import FileDeleted, FileList, FileObject
from api.paging import cursor_fields
from storage.adapters.registry import ADAPTER_PURPOSE
from storage.errors import InvalidRequest, UploadTooLarge
from storage.files.files import (
    check_filename,
    content_disposition,
    delete_file,
    get_file,
    list_files,
    put_file_object,
    record_file,
    reserve_file,
)
from storage.lines.reader import check_utf8_jsonl, clip

router = APIRouter(prefix="/v1/files", tags=["files"])

PURPOSES = ("batch", ADAPTER_PURPOSE)  # `adapter`: a LoRA adapter's files, any bytes (docs/adapters.md)
EXPIRES_MIN_SECONDS, EXPIRES_MAX_SECONDS = 3600, 30 * 86400  # OpenAI's bounds for expires_after.seconds


def expiry_seconds(anchor: str | None, seconds: str | int | None, *, param: str) -> int | None:
    """OpenAI's `{anchor: "created_at", seconds: N}` checked (3600 <= N <= 2592000); None when not given."""
    if anchor is None and seconds is None:
        return None
    if anchor != "created_at":
        raise InvalidRequest(f"Invalid '{param}.anchor': only 'created_at' is supported.", param=f"{param}.anchor")
    text = str(seconds).strip() if seconds is not None else ""
    if not (text.isascii() and text.isdigit()) or not EXPIRES_MIN_SECONDS <= int(text) <= EXPIRES_MAX_SECONDS:
        raise InvalidRequest(
            f"Invalid '{param}.seconds': must be an integer between {EXPIRES_MIN_SECONDS} and {EXPIRES_MAX_SECONDS}.",
            param=f"{param}.seconds",
        )
    return int(text)


UPLOAD_FIELDS = {"purpose": None, "expires_after[anchor]": 32, "expires_after[seconds]": 16}  # name: max chars
_UPLOAD_FORM = {
    "type": "object",
    "required": ["file", "purpose"],
    "properties": {
        "file": {"type": "string", "contentMediaType": "application/octet-stream", "title": "File"},
        "purpose": {"type": "string", "enum": list(PURPOSES), "title": "Purpose"},
        **{
            name: {"anyOf": [{"type": "string", "maxLength": chars}, {"type": "null"}], "title": name}
            for name, chars in UPLOAD_FIELDS.items()
            if chars
        },
    },
}


def _bounded(chunks: Iterable[bytes], *, limit: int) -> Iterator[bytes]:
    total = 0
    for chunk in chunks:
        total += len(chunk)
        if total > limit:
            raise UploadTooLarge(f"File is larger than the {limit} byte limit.", param="file")
        yield chunk


def upload_fields(fields: dict[str, str], *, final: bool, default_expiry: int | None) -> tuple[str, int | None]:
    """The purpose and expiry the form names, or the 400 FastAPI's form validation gave for them; before the
    body's end (`final=False`) a missing purpose is not yet an error and the expiry is not judged."""
    for name, chars in UPLOAD_FIELDS.items():
        if chars and len(fields.get(name, "")) > chars:
            raise InvalidRequest(
                f"Invalid value for '{name}': String should have at most {chars} characters.",
                param=name,
                code="invalid_request",
            )
    purpose = fields.get("purpose")
    if purpose is None:
        if final:
            raise missing("purpose")
        return "", None
    if purpose not in PURPOSES:
        raise InvalidRequest(
            f"Invalid purpose {clip(purpose)}: uploads support 'batch' and 'adapter'.", param="purpose"
        )
    if not final:
        return purpose, None
    expires = expiry_seconds(
        fields.get("expires_after[anchor]"), fields.get("expires_after[seconds]"), param="expires_after"
    )
    return purpose, default_expiry if expires is None else expires


@router.post(
    "",
    response_model=FileObject,
    openapi_extra={"requestBody": {"required": True, "content": {"multipart/form-data": {"schema": _UPLOAD_FORM}}}},
)
def upload_file(request: Request, session: DbSession, caller: Caller, blobs: Blobs, settings: Config) -> FileObject:
    """Upload a JSONL file of batch requests (purpose `batch`), or one of a LoRA adapter's two files (purpose
    `adapter`: `adapter_config.json` or `adapter_model.safetensors`, then `POST /v1/adapters`); it is streamed to
    object storage.

    `expires_after={anchor: created_at, seconds: N}` (3600 <= N <= 2592000) sets when it expires; by default
    a batch file expires after 30 days (`BACKFILL_BATCH_FILE_EXPIRES_SECONDS`).

    The multipart body is read once, as it arrives (api/multipart.py): the file's bytes are checked (UTF-8,
    JSONL), hashed and sent to object storage part by part while the client is still sending, with no spool
    file. The SDKs send `purpose` before `file`, so a bad purpose is refused before any byte is stored; form
    fields sent after the file are judged at the body's end, and the stored object is removed if they fail."""
    body = body_chunks(request, gather_bytes=settings.stream_chunk_bytes)
    form = FormStream(request.headers.get("content-type", ""), body, file_field="file", keep=tuple(UPLOAD_FIELDS))
    if not form.read_to_file():
        raise missing("file")
    default_expiry = settings.batch_file_expires_seconds or None
    early, _ = upload_fields(form.fields, final=False, default_expiry=default_expiry)
    # Kept as the user's label, never used as a path: objects are keyed by file id alone.
    filename = check_filename(form.filename or "upload.jsonl")
    new = reserve_file(session, tenant_id=caller.tenant_id)
    session.commit()  # no transaction (or pooled connection) is held while the body streams in
    # api/limits.py already refused a larger declared or streamed body; this bounds the file part itself.
    chunks = _bounded(form.file_chunks(), limit=settings.upload_max_bytes)
    if early != ADAPTER_PURPOSE:  # an adapter's files (sent with `purpose` first, as the SDKs do) are binary
        chunks = check_utf8_jsonl(chunks)
    try:
        stored = put_file_object(session, blobs, new, chunks=chunks)
    except ValueError as error:
        raise InvalidRequest(str(error), param="file", code="invalid_file_format") from None
    try:
        purpose, expires = upload_fields(form.fields, final=True, default_expiry=default_expiry)
        if stored.size == 0:
            raise InvalidRequest("The file is empty.", param="file", code="empty_file")
    except InvalidRequest:
        blobs.delete(stored.key)
        raise
    row = record_file(session, new, stored, filename=filename, purpose=purpose, expires_after_seconds=expires)
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
