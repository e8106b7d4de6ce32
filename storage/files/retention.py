"""Retention: expired files lose their object and their row, a bounded number per pass.

A file expires at `expires_at` (OpenAI's `expires_after` on upload, 30 days for purpose=batch by default;
`output_expires_after` on a batch for its result files). From that moment it answers 404 like a deleted
file (`storage.files.files.get_file`); the sweep then removes the object and the row, oldest expiry first, at
most `limit` files and about `budget_seconds` of object deletes per pass, so a backlog of expired files is
worked off over several passes instead of stalling one. A batch whose input file expires keeps running:
its queue rows hold their own bodies.
"""

from __future__ import annotations

import logging
import time

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from storage.clock import now
from storage.files.blobs import BlobStore
from storage.files.manifest_refs import forget_file
from storage.models import File

log = logging.getLogger(__name__)

SWEEP_BUDGET_SECONDS = 2.0


def sweep_expired_files(
    session: Session, blobs: BlobStore, *, limit: int, budget_seconds: float = SWEEP_BUDGET_SECONDS
) -> int:
    """Delete up to `limit` expired files (object, then row); return how many are gone."""
    expired = session.execute(
        select(File.id, File.blob_key)
        .where(File.expires_at <= now())
        .order_by(File.expires_at)
        .limit(limit)
        .with_for_update(skip_locked=True)
    ).all()
    started = time.monotonic()
    gone: list[str] = []
    for file_id, blob_key in expired:
        if time.monotonic() - started > budget_seconds:
            break
        try:
            forget_file(session, blobs, file_id=file_id)  # manifests naming it say its key is null
            blobs.delete(blob_key)  # idempotent: a deleted file's object is already gone
        except Exception:  # one unreachable object must not stop the sweep; its row stays for the next pass
            log.warning("retention: could not delete the object of %s; retrying next pass", file_id, exc_info=True)
            continue
        gone.append(file_id)
    if gone:
        session.execute(delete(File).where(File.id.in_(gone)).execution_options(synchronize_session=False))
        log.info("retention: %d expired files deleted", len(gone))
    return len(gone)
