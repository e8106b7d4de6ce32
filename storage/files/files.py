"""File objects: uploads (purpose=batch) and results (purpose=batch_output)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import quote

from sqlalchemy import select
from sqlalchemy.orm import Session

from storage.clock import now
from storage.errors import FileNotFound, InvalidRequest, QuotaExceeded
from storage.files.blobs import BlobStore, StoredBlob, delete_on_rollback
from storage.files.blobs.layout import input_file_key, tenant_segment
from storage.files.manifest_refs import forget_file
from storage.ids import new_id
from storage.models import File
from storage.paging import keyset_page
from storage.protocols import PROTOCOLS
from storage.quotas import check_file_room
from storage.settings import get_settings
from storage.tenants import tenant_name

# Files a protocol keeps for its own batches (their inline requests, their results): not listed at /v1/files.
INTERNAL_PURPOSES = tuple(purpose for protocol in PROTOCOLS.values() for purpose in protocol.internal_purposes)


def create_file(
    session: Session,
    blobs: BlobStore,
    *,
    tenant_id: str,
    filename: str,
    purpose: str,
    chunks: Iterable[bytes],
    file_id: str | None = None,
    expires_after_seconds: int | None = None,
) -> File:
    """Stream `chunks` into object storage and record the file row (key, size, checksum, expiry)."""
    new = reserve_file(session, tenant_id=tenant_id, file_id=file_id)
    stored = put_file_object(session, blobs, new, chunks=chunks)
    return record_file(
        session,
        new,
        stored,
        filename=filename,
        purpose=purpose,
        expires_after_seconds=expires_after_seconds,
    )


@dataclass(frozen=True)
class NewFile:
    """A file about to be stored: its tenant, id and object key (nothing written yet)."""

    tenant_id: str
    id: str
    key: str


def reserve_file(session: Session, *, tenant_id: str, file_id: str | None = None) -> NewFile:
    """Check the tenant has room for one more file and choose its id and object key."""
    check_file_room(session, get_settings(), tenant_id=tenant_id)
    file_id = file_id or new_id("file-")
    return NewFile(
        tenant_id, file_id, input_file_key(tenant=tenant_folder(session, tenant_id=tenant_id), file_id=file_id)
    )


def put_file_object(session: Session, blobs: BlobStore, new: NewFile, *, chunks: Iterable[bytes]) -> StoredBlob:
    """Stream `chunks` to the file's object, removed again if the session rolls back or the bytes pass the quota."""
    stored = blobs.put_stream(new.key, chunks)
    delete_on_rollback(session, blobs, stored.key)  # the row may never land (a failed flush or commit)
    try:
        check_file_room(session, get_settings(), tenant_id=new.tenant_id, adding_bytes=stored.size)
    except QuotaExceeded:
        blobs.delete(stored.key)
        raise
    return stored


def record_file(
    session: Session,
    new: NewFile,
    stored: StoredBlob,
    *,
    filename: str,
    purpose: str,
    expires_after_seconds: int | None = None,
) -> File:
    """The row of a file whose object `put_file_object` wrote."""
    created = now()
    row = File(
        id=new.id,
        tenant_id=new.tenant_id,
        filename=filename,
        purpose=purpose,
        bytes=stored.size,
        blob_key=stored.key,
        sha256=stored.sha256,
        created_at=created,
        expires_at=created + expires_after_seconds if expires_after_seconds else None,
    )
    session.add(row)
    session.flush()
    return row


def tenant_folder(session: Session, *, tenant_id: str) -> str:
    """The tenant's folder in object storage (the key rule itself is storage/files/blobs/layout.py)."""
    return tenant_segment(tenant_id=tenant_id, tenant_name=tenant_name(session, tenant_id=tenant_id))


FILENAME_MAX_CHARS = 512  # the column's width


def check_filename(name: str) -> str:
    """The name as given, or InvalidRequest if a database cannot hold it (too long, NUL or control characters).

    A filename is the user's label and is returned verbatim (`../../etc/passwd` included); it is never
    part of an object key or a path: `storage/files/blobs/layout.py` keys objects by tenant and file id alone.
    """
    if len(name) > FILENAME_MAX_CHARS:
        raise InvalidRequest(f"The filename is longer than {FILENAME_MAX_CHARS} characters.", param="file")
    if any(ord(char) < 32 or ord(char) == 127 for char in name):
        raise InvalidRequest("The filename contains control characters.", param="file", code="invalid_filename")
    return name


def content_disposition(filename: str) -> str:
    """`attachment` with an ASCII fallback and the exact name as RFC 5987 `filename*` (any script, no path)."""
    fallback = "".join(c if 32 <= ord(c) < 127 and c not in '"\\/' else "_" for c in filename) or "download"
    return f"attachment; filename=\"{fallback}\"; filename*=UTF-8''{quote(filename, safe='')}"


def record_result_file(
    session: Session,
    *,
    file_id: str,
    tenant_id: str,
    filename: str,
    blob_key: str,
    size: int,
    sha256: str,
    expires_after_seconds: int | None = None,
    purpose: str = "batch_output",
) -> File:
    """The row of a result file whose object is already written (idempotent: a finalize re-run keeps the row)."""
    row = session.get(File, file_id)
    if row is None:
        created = now()
        row = File(
            id=file_id,
            tenant_id=tenant_id,
            filename=filename,
            purpose=purpose,
            bytes=size,
            blob_key=blob_key,
            sha256=sha256,
            created_at=created,
            expires_at=created + expires_after_seconds if expires_after_seconds else None,
        )
        session.add(row)
        session.flush()
    return row


def get_file(session: Session, *, tenant_id: str, file_id: str) -> File:
    """The tenant's live file, or FileNotFound (foreign, deleted and expired ids look exactly like missing ones)."""
    row = session.get(File, file_id)
    if row is None or row.tenant_id != tenant_id or row.deleted_at is not None or is_expired(row):
        raise FileNotFound(f"No such File object: {file_id}", param="file_id")
    return row


def is_expired(row: File) -> bool:
    """True once the file's expiry has passed, whether or not the retention sweep has removed it yet."""
    return row.expires_at is not None and row.expires_at <= now()


def list_files(
    session: Session, *, tenant_id: str, purpose: str | None, after: str | None, limit: int, order: str
) -> list[File]:
    """The tenant's files, newest first by default, `limit + 1` rows to tell if more exist."""
    query = select(File).where(
        File.tenant_id == tenant_id, File.deleted_at.is_(None), (File.expires_at.is_(None)) | (File.expires_at > now())
    )
    wanted = File.purpose == purpose if purpose else File.purpose.not_in(INTERNAL_PURPOSES)
    query = query.where(wanted)
    found = session.get(File, after) if after else None
    anchor = (found.created_at, found.id) if found is not None and found.tenant_id == tenant_id else None
    key = (File.created_at, File.id)
    return keyset_page(session, query, key=key, anchor=anchor, limit=limit, descending=order != "asc")


def delete_file(session: Session, blobs: BlobStore, *, tenant_id: str, file_id: str) -> File:
    """Hide the file and remove its object; batches that used it keep their own copy of each line."""
    row = get_file(session, tenant_id=tenant_id, file_id=file_id)
    row.deleted_at = now()
    session.flush()
    forget_file(session, blobs, file_id=row.id)
    blobs.delete(row.blob_key)
    return row
