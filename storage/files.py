"""File objects: uploads (purpose=batch) and results (purpose=batch_output)."""

from __future__ import annotations

from collections.abc import Iterable

from sqlalchemy import select
from sqlalchemy.orm import Session

from storage.blobs import BlobStore
from storage.clock import now
from storage.errors import FileNotFound
from storage.ids import new_id
from storage.models import File

# Files Backfill keeps for an Anthropic Message Batch (its requests, its results): not listed at /v1/files.
INTERNAL_PURPOSES = ("message_batch_input", "message_batch_results")


def create_file(
    session: Session,
    blobs: BlobStore,
    *,
    tenant_id: str,
    filename: str,
    purpose: str,
    chunks: Iterable[bytes],
    file_id: str | None = None,
) -> File:
    """Stream `chunks` into object storage and record the file row (key, size, checksum)."""
    file_id = file_id or new_id("file-")
    stored = blobs.put_stream(blob_key_for(file_id), chunks)
    row = File(
        id=file_id,
        tenant_id=tenant_id,
        filename=filename,
        purpose=purpose,
        bytes=stored.size,
        blob_key=stored.key,
        sha256=stored.sha256,
        created_at=now(),
    )
    session.add(row)
    session.flush()
    return row


def blob_key_for(file_id: str) -> str:
    """Where a file's bytes live in object storage: the one key rule for uploads and result files."""
    return f"files/{file_id}"


def record_result_file(
    session: Session,
    *,
    file_id: str,
    tenant_id: str,
    filename: str,
    size: int,
    sha256: str,
    purpose: str = "batch_output",
) -> File:
    """The row of a result file whose object is already written (idempotent: a finalize re-run keeps the row)."""
    row = session.get(File, file_id)
    if row is None:
        row = File(
            id=file_id,
            tenant_id=tenant_id,
            filename=filename,
            purpose=purpose,
            bytes=size,
            blob_key=blob_key_for(file_id),
            sha256=sha256,
            created_at=now(),
        )
        session.add(row)
        session.flush()
    return row


def get_file(session: Session, *, tenant_id: str, file_id: str) -> File:
    """The tenant's live file, or FileNotFound (foreign ids look exactly like missing ones)."""
    row = session.get(File, file_id)
    if row is None or row.tenant_id != tenant_id or row.deleted_at is not None:
        raise FileNotFound(f"No such File object: {file_id}", param="file_id")
    return row


def list_files(
    session: Session, *, tenant_id: str, purpose: str | None, after: str | None, limit: int, order: str
) -> list[File]:
    """The tenant's files, newest first by default, `limit + 1` rows to tell if more exist."""
    query = select(File).where(File.tenant_id == tenant_id, File.deleted_at.is_(None))
    wanted = File.purpose == purpose if purpose else File.purpose.not_in(INTERNAL_PURPOSES)
    query = query.where(wanted)
    descending = order != "asc"
    if after:
        anchor = session.get(File, after)
        if anchor is not None and anchor.tenant_id == tenant_id:
            key = (anchor.created_at, anchor.id)
            if descending:
                query = query.where((File.created_at < key[0]) | ((File.created_at == key[0]) & (File.id < key[1])))
            else:
                query = query.where((File.created_at > key[0]) | ((File.created_at == key[0]) & (File.id > key[1])))
    if descending:
        query = query.order_by(File.created_at.desc(), File.id.desc())
    else:
        query = query.order_by(File.created_at.asc(), File.id.asc())
    return list(session.scalars(query.limit(limit + 1)))


def delete_file(session: Session, blobs: BlobStore, *, tenant_id: str, file_id: str) -> File:
    """Hide the file and remove its object; batches that used it keep their own copy of each line."""
    row = get_file(session, tenant_id=tenant_id, file_id=file_id)
    row.deleted_at = now()
    session.flush()
    blobs.delete(row.blob_key)
    return row
