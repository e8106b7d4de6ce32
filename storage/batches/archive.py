"""Ended batches whose results passed their protocol's retention are archived: their content scrubbed, their
files marked deleted (the objects go after commit); the row, its usage and its cost stay for the reports."""

from __future__ import annotations

from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from storage import lifecycle
from storage.clock import now
from storage.models import Batch, File
from storage.protocols import Protocol
from storage.queue.batch_rows import scrub_content

ARCHIVE_PER_PASS = 100


def archive_due(
    session: Session, *, protocol: Protocol, retention_seconds: int, limit: int = ARCHIVE_PER_PASS
) -> list[str]:
    """Archive the protocol's batches whose results passed their retention; return the object keys to remove."""
    cutoff = now() - retention_seconds
    due = list(
        session.scalars(
            select(Batch)
            .where(
                Batch.protocol == protocol.name,
                Batch.archived_at.is_(None),
                Batch.status.in_(lifecycle.TERMINAL),
                or_(
                    Batch.completed_at <= cutoff,
                    Batch.cancelled_at <= cutoff,
                    Batch.expired_at <= cutoff,
                    Batch.failed_at <= cutoff,
                ),
            )
            .limit(limit)
            .with_for_update(skip_locked=True)
        )
    )
    keys: list[str] = []
    for batch in due:
        batch.archived_at = now()
        keys += drop_content(session, batch)
    return keys


def drop_content(session: Session, batch: Batch) -> list[str]:
    """Scrub a batch's request and result bodies and mark its files deleted; return their object keys."""
    scrub_content(session, batch_id=batch.id)
    keys = []
    for file_id in (batch.input_file_id, batch.output_file_id, batch.error_file_id):
        row = session.get(File, file_id) if file_id else None
        if row is not None and row.deleted_at is None:
            row.deleted_at = now()
            keys.append(row.blob_key)
    session.flush()
    return keys
