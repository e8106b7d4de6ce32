"""Uploads (OpenAI's Uploads API): a file of up to 8 GB sent in parts of up to 64 MB, then completed into a File.

The object store does the assembling (storage/files/blobs/): creating an Upload opens a multipart object at the
key its File will have, each part streams straight into it as a store part numbered in arrival order, and
completing it makes the listed parts the File's object in place (S3's CompleteMultipartUpload; on the local store
a manifest of the part files): no byte is copied or read back. The File's SHA-256 is taken by the first full read
(the md5 check at complete when one is given, else ingest's validation pass: `fill_checksum`).

States are OpenAI's: `pending` until completed, cancelled or expired (an hour after creation). Cancelled and
expired uploads have their parts aborted at once and, failing that, by the sweep (`sweep_uploads`, each reaper
pass), which also expires the overdue ones. Quotas count pending uploads as files of their declared size.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from storage.clock import now
from storage.errors import ChecksumMismatch, InvalidRequest, PartTooLarge, UploadNotFound, UploadNotPending
from storage.files.blobs import (
    BlobStore,
    PartsGone,
    PartSizeMismatch,
    PartsOutOfOrder,
    StoredBlob,
    StoredPart,
    delete_on_rollback,
)
from storage.files.files import NewFile, check_filename, record_file, reserve_file
from storage.ids import new_id
from storage.models import File, Upload, UploadPart
from storage.quotas import check_file_room
from storage.settings import Settings

log = logging.getLogger(__name__)

PENDING, COMPLETED, CANCELLED, EXPIRED = "pending", "completed", "cancelled", "expired"
PARTS_MAX = 10_000  # part numbers an upload may hand out: S3's multipart limit
MIME_TYPE_MAX_CHARS = 255


def create_upload(
    session: Session,
    blobs: BlobStore,
    settings: Settings,
    *,
    tenant_id: str,
    size: int,
    filename: str,
    purpose: str,
    mime_type: str,
    file_expires_after_seconds: int | None,
) -> Upload:
    """A pending Upload of `size` bytes, its multipart object opened in the store (aborted if the row never lands)."""
    if not 1 <= size <= settings.upload_total_max_bytes:
        raise InvalidRequest(
            f"Invalid 'bytes': an upload holds between 1 and {settings.upload_total_max_bytes} bytes.", param="bytes"
        )
    if not mime_type or len(mime_type) > MIME_TYPE_MAX_CHARS or any(ord(c) < 32 or ord(c) == 127 for c in mime_type):
        raise InvalidRequest(
            f"Invalid 'mime_type': 1 to {MIME_TYPE_MAX_CHARS} printable characters.", param="mime_type"
        )
    new = reserve_file(session, tenant_id=tenant_id)
    check_file_room(session, settings, tenant_id=tenant_id, adding_bytes=size)  # pending uploads count too
    created = now()
    upload = Upload(
        id=new_id("upload_"),
        tenant_id=tenant_id,
        filename=check_filename(filename),
        purpose=purpose,
        mime_type=mime_type,
        bytes=size,
        status=PENDING,
        created_at=created,
        expires_at=created + settings.upload_expires_seconds,
        file_id=new.id,
        blob_key=new.key,
        store_upload_id=blobs.start_parts(new.key),
        file_expires_after_seconds=file_expires_after_seconds,
        parts_started=0,
        parts_cleared=False,
    )
    delete_on_rollback(session, blobs, new.key, upload_id=upload.store_upload_id)
    session.add(upload)
    session.flush()
    return upload


@dataclass(frozen=True)
class PartSlot:
    """A part number handed to one part request, before its bytes arrive."""

    upload_id: str
    tenant_id: str
    number: int
    blob_key: str
    store_upload_id: str
    declared_bytes: int


def start_part(session: Session, *, tenant_id: str, upload_id: str) -> PartSlot:
    """Hand out the upload's next part number (arrival order), or say why no part may be added."""
    numbered = session.execute(
        update(Upload)
        .where(Upload.id == upload_id, Upload.tenant_id == tenant_id, Upload.status == PENDING)
        .where(Upload.expires_at > now(), Upload.parts_started < PARTS_MAX)
        .values(parts_started=Upload.parts_started + 1)
        .returning(Upload.parts_started, Upload.blob_key, Upload.store_upload_id, Upload.bytes)
    ).one_or_none()
    if numbered is None:
        upload = _get(session, tenant_id=tenant_id, upload_id=upload_id)
        _raise_not_pending(upload)
        raise InvalidRequest(
            f"Upload {upload_id} already has {PARTS_MAX} parts, the most one upload may have: complete it with the "
            "parts it has, or cancel it and upload the file in larger parts (up to 64 MB each).",
            param="data",
            code="too_many_parts",
        )
    number, key, store_id, declared = numbered
    return PartSlot(upload_id, tenant_id, number, key, store_id, declared)


def put_part(
    session: Session,
    blobs: BlobStore,
    settings: Settings,
    slot: PartSlot,
    *,
    chunks: Iterable[bytes],
    size: int | None,
) -> UploadPart:
    """Stream one part into the store and record it; a part that lands after a cancel or an expiry is removed."""
    limit = settings.upload_part_max_bytes
    if size is not None and size > limit:
        raise PartTooLarge(f"The part is larger than the {limit} byte limit.", param="data")
    try:
        stored = blobs.put_part(slot.blob_key, slot.store_upload_id, slot.number, _bounded(chunks, limit), size=size)
    except PartSizeMismatch:
        raise InvalidRequest(
            "The part's bytes did not match the size its Content-Length announced: send `data` as the form's last "
            "field, with no epilogue after the closing boundary.",
            param="data",
        ) from None
    except Exception:  # a part racing a complete, a cancel or the expiry: say so rather than how the store failed
        _raise_not_pending(_get(session, tenant_id=slot.tenant_id, upload_id=slot.upload_id))
        raise
    return _record_part(session, blobs, slot, stored)


def _record_part(session: Session, blobs: BlobStore, slot: PartSlot, stored: StoredPart) -> UploadPart:
    upload = _get(session, tenant_id=slot.tenant_id, upload_id=slot.upload_id, lock=True)
    if upload.status in (CANCELLED, EXPIRED):
        blobs.abort_parts(upload.blob_key, upload.store_upload_id)  # S3: a part in flight during an abort may land
    _raise_not_pending(upload)
    if stored.size == 0:
        raise InvalidRequest("The part is empty: send at least one byte in `data`.", param="data")
    held = session.scalar(select(func.coalesce(func.sum(UploadPart.bytes), 0)).where(UploadPart.upload_id == upload.id))
    if int(held or 0) + stored.size > 2 * upload.bytes:
        raise InvalidRequest(
            f"The parts of upload {upload.id} would add up to more than twice its {upload.bytes} declared bytes.",
            param="data",
        )
    part = UploadPart(
        id=new_id("part_"),
        upload_id=upload.id,
        number=stored.number,
        bytes=stored.size,
        etag=stored.etag,
        created_at=now(),
    )
    session.add(part)
    session.flush()
    return part


def complete_upload(
    session: Session,
    blobs: BlobStore,
    settings: Settings,
    *,
    tenant_id: str,
    upload_id: str,
    part_ids: list[str],
    md5: str | None,
) -> tuple[Upload, File]:
    """Make the listed parts, in the listed order, the upload's File (in place: nothing is copied)."""
    upload = _claim(session, tenant_id=tenant_id, upload_id=upload_id)
    parts = _listed_parts(session, settings, upload, part_ids)
    stored = [StoredPart(number=part.number, size=part.bytes, etag=part.etag) for part in parts]
    try:
        blobs.finish_parts(upload.blob_key, upload.store_upload_id, stored)
    except PartsOutOfOrder:
        raise InvalidRequest(
            "This server's object store joins parts in the order they were uploaded: list `part_ids` in that order "
            "(a subset is fine), or upload the parts one after another in the file's order.",
            param="part_ids",
            code="parts_out_of_order",
        ) from None
    except PartsGone:
        raise UploadNotPending(
            f"The parts of upload {upload.id} are no longer in object storage: cancel it and start a new upload."
        ) from None
    delete_on_rollback(session, blobs, upload.blob_key)  # the File's object never outlives a row that did not land
    sha256 = ""
    if md5:
        sha256 = _check_md5(session, blobs, settings, upload, md5=md5)
    new = NewFile(tenant_id=upload.tenant_id, id=upload.file_id, key=upload.blob_key)
    row = record_file(
        session,
        new,
        StoredBlob(key=upload.blob_key, size=upload.bytes, sha256=sha256),
        filename=upload.filename,
        purpose=upload.purpose,
        expires_after_seconds=upload.file_expires_after_seconds,
    )
    upload.status, upload.parts_cleared = COMPLETED, True
    session.flush()
    return upload, row


def _check_md5(session: Session, blobs: BlobStore, settings: Settings, upload: Upload, *, md5: str) -> str:
    """One streamed pass over the completed object: its md5 against `md5`, and its SHA-256 (returned)."""
    md5_digest, sha_digest = hashlib.md5(usedforsecurity=False), hashlib.sha256()
    for chunk in blobs.open_stream(upload.blob_key, chunk_bytes=settings.stream_chunk_bytes):
        md5_digest.update(chunk)
        sha_digest.update(chunk)
    if md5_digest.hexdigest() == md5.lower():
        return sha_digest.hexdigest()
    blobs.delete(upload.blob_key)
    upload.status, upload.parts_cleared = CANCELLED, True
    session.flush()
    raise ChecksumMismatch(
        f"The md5 of the uploaded bytes is {md5_digest.hexdigest()}, not {md5}: upload {upload.id} was cancelled. "
        "Check the file and the part order, and start a new upload.",
        param="md5",
    )


def cancel_upload(session: Session, blobs: BlobStore, *, tenant_id: str, upload_id: str) -> Upload:
    """Cancel a pending upload and remove its parts (a cancelled one is returned as it is)."""
    claimed = session.execute(
        update(Upload)
        .where(Upload.id == upload_id, Upload.tenant_id == tenant_id, Upload.status == PENDING)
        .values(status=CANCELLED)
    )
    upload = _get(session, tenant_id=tenant_id, upload_id=upload_id)
    if not claimed.rowcount and upload.status != CANCELLED:  # type: ignore[attr-defined]
        _raise_not_pending(upload)
    if not upload.parts_cleared:
        _clear(blobs, upload)
    return upload


def sweep_uploads(session: Session, blobs: BlobStore, *, limit: int) -> int:
    """Expire pending uploads past their hour, then abort the parts of cancelled and expired ones still holding
    any (at most `limit` per pass); return how many were cleared."""
    session.execute(update(Upload).where(Upload.status == PENDING, Upload.expires_at <= now()).values(status=EXPIRED))
    uncleared = session.scalars(
        select(Upload)
        .where(Upload.status.in_((CANCELLED, EXPIRED)), Upload.parts_cleared.is_(False))
        .order_by(Upload.expires_at)
        .limit(limit)
        .with_for_update(skip_locked=True)
    ).all()
    cleared = sum(_clear(blobs, upload) for upload in uncleared)
    if cleared:
        log.info("uploads: the parts of %d cancelled or expired uploads removed", cleared)
    return cleared


def fill_checksum(session: Session, *, file_id: str, sha256: str) -> None:
    """Record a file's SHA-256 taken by its first full read (an Upload's file has none until then)."""
    session.execute(update(File).where(File.id == file_id, File.sha256 == "").values(sha256=sha256))


def _clear(blobs: BlobStore, upload: Upload) -> bool:
    try:
        blobs.abort_parts(upload.blob_key, upload.store_upload_id)
    except Exception:  # the store is unreachable, or a part landed meanwhile: the next sweep tries again
        log.warning("uploads: could not remove the parts of %s; retrying next pass", upload.id, exc_info=True)
        return False
    upload.parts_cleared = True
    return True


def _claim(session: Session, *, tenant_id: str, upload_id: str) -> Upload:
    """The pending upload, locked against a concurrent complete, cancel or expiry (the first statement: on SQLite
    it takes the write lock before anything is read)."""
    claimed = session.execute(
        update(Upload)
        .where(Upload.id == upload_id, Upload.tenant_id == tenant_id, Upload.status == PENDING)
        .where(Upload.expires_at > now())
        .values(status=PENDING)
    )
    upload = _get(session, tenant_id=tenant_id, upload_id=upload_id)
    if not claimed.rowcount:  # type: ignore[attr-defined]
        _raise_not_pending(upload)
    return upload


def _listed_parts(session: Session, settings: Settings, upload: Upload, part_ids: list[str]) -> list[UploadPart]:
    if not part_ids:
        raise InvalidRequest("Invalid 'part_ids': list at least one part.", param="part_ids")
    repeated = next((part_id for i, part_id in enumerate(part_ids) if part_id in part_ids[:i]), None)
    if repeated is not None:
        raise InvalidRequest(f"Invalid 'part_ids': {repeated} is listed twice.", param="part_ids")
    found = {
        part.id: part
        for part in session.scalars(
            select(UploadPart).where(UploadPart.upload_id == upload.id, UploadPart.id.in_(set(part_ids)))
        )
    }
    missing = next((part_id for part_id in part_ids if part_id not in found), None)
    if missing is not None:
        raise InvalidRequest(
            f"Invalid 'part_ids': {missing[:64]} is not a part of upload {upload.id}.", param="part_ids"
        )
    parts = [found[part_id] for part_id in part_ids]
    total = sum(part.bytes for part in parts)
    if total != upload.bytes:
        raise InvalidRequest(
            f"The listed parts hold {total} bytes; upload {upload.id} was created for {upload.bytes}.",
            param="part_ids",
            code="upload_size_mismatch",
        )
    small = next((part for part in parts[:-1] if part.bytes < settings.upload_part_min_bytes), None)
    if small is not None:
        raise InvalidRequest(
            f"Part {small.id} holds {small.bytes} bytes: every part but the last must hold at least "
            f"{settings.upload_part_min_bytes} bytes (object storage's multipart minimum).",
            param="part_ids",
            code="part_too_small",
        )
    return parts


def upload_status(upload: Upload) -> str:
    """The status a client sees: a pending upload past its hour is `expired` before the sweep marks it."""
    return EXPIRED if upload.status == PENDING and upload.expires_at <= now() else upload.status


def _get(session: Session, *, tenant_id: str, upload_id: str, lock: bool = False) -> Upload:
    query = select(Upload).where(Upload.id == upload_id, Upload.tenant_id == tenant_id)
    upload = session.scalars(query.with_for_update() if lock else query).one_or_none()
    if upload is None:
        raise UploadNotFound(f"No such Upload object: {upload_id[:64]}", param="upload_id")
    return upload


def _raise_not_pending(upload: Upload) -> None:
    if upload.status == PENDING and upload.expires_at <= now():
        raise UploadNotPending(f"Upload {upload.id} has expired: uploads must be completed within an hour.")
    if upload.status != PENDING:
        raise UploadNotPending(f"Upload {upload.id} is already {upload.status}.")


def _bounded(chunks: Iterable[bytes], limit: int) -> Iterator[bytes]:
    total = 0
    for chunk in chunks:
        total += len(chunk)
        if total > limit:
            raise PartTooLarge(f"The part is larger than the {limit} byte limit.", param="data")
        yield chunk
