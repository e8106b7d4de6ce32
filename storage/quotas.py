"""Per-tenant quotas the operator sets (BACKFILL_TENANT_MAX_*, BACKFILL_TENANT_QUOTAS): live files, their stored
bytes (pending Uploads count as files of their declared size), open batches. Checked where files and batches are
created, for both protocols; a create past a quota
raises QuotaExceeded (429) before anything is queued, and an upload's object goes with the rolled-back row.

The counts are read without a lock: a burst of concurrent creates may overshoot a quota by a few, never by
an unbounded amount (each create still checks before it stores). Result files are never refused: a batch
that ran keeps its results whatever its tenant holds.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from storage import lifecycle
from storage.clock import now
from storage.errors import QuotaExceeded
from storage.models import Batch, File, Tenant, Upload
from storage.settings import Settings


@dataclass(frozen=True)
class Quota:
    """A tenant's limits; 0 is unlimited."""

    max_files: int
    max_stored_bytes: int
    max_open_batches: int
    max_priority: int = 0  # the highest batch priority the tenant may set (storage/batches/control.py)


def quota_of(session: Session, settings: Settings, *, tenant_id: str) -> Quota:
    """The tenant's quota: the defaults, overridden by its entry (by name or id) in `tenant_quotas`."""
    override = settings.tenant_quotas.get(tenant_id)
    if override is None and settings.tenant_quotas:
        name = session.scalar(select(Tenant.name).where(Tenant.id == tenant_id))
        override = settings.tenant_quotas.get(name or "")

    def pick(field: str) -> int:
        value = getattr(override, field) if override is not None else None
        return int(value if value is not None else getattr(settings, f"tenant_{field}"))

    return Quota(pick("max_files"), pick("max_stored_bytes"), pick("max_open_batches"), pick("max_priority"))


def _live_files(session: Session, *, tenant_id: str) -> tuple[int, int]:
    """Live files, and pending Uploads (storage/files/uploads.py) as the files of their declared size they become."""
    unexpired = File.expires_at.is_(None) | (File.expires_at > now())
    live = (File.tenant_id == tenant_id, File.deleted_at.is_(None), unexpired)
    count, size = session.execute(select(func.count(), func.coalesce(func.sum(File.bytes), 0)).where(*live)).one()
    pending = (Upload.tenant_id == tenant_id, Upload.status == "pending", Upload.expires_at > now())
    uploads, declared = session.execute(
        select(func.count(), func.coalesce(func.sum(Upload.bytes), 0)).where(*pending)
    ).one()
    return int(count) + int(uploads), int(size) + int(declared)


def check_file_room(session: Session, settings: Settings, *, tenant_id: str, adding_bytes: int = 0) -> None:
    """Refuse a new file if the tenant holds its quota of files already, or its bytes would pass the quota."""
    quota = quota_of(session, settings, tenant_id=tenant_id)
    if not quota.max_files and not quota.max_stored_bytes:
        return
    count, size = _live_files(session, tenant_id=tenant_id)
    if quota.max_files and count >= quota.max_files:
        raise QuotaExceeded(
            f"This tenant already holds {count} files, its quota of {quota.max_files} files. "
            "Delete files you no longer need, or ask the operator for a larger quota.",
            param="file",
        )
    if quota.max_stored_bytes and size + adding_bytes > quota.max_stored_bytes:
        raise QuotaExceeded(
            f"This file would bring the tenant's stored files to {size + adding_bytes} bytes, past its quota of "
            f"{quota.max_stored_bytes} bytes. Delete files you no longer need, or ask the operator for more.",
            param="file",
        )


def check_batch_room(session: Session, settings: Settings, *, tenant_id: str) -> None:
    """Refuse a new batch if the tenant has its quota of batches not yet ended (either protocol)."""
    limit = quota_of(session, settings, tenant_id=tenant_id).max_open_batches
    if not limit:
        return
    open_batches = session.scalar(
        select(func.count()).where(
            Batch.tenant_id == tenant_id, Batch.status.not_in(lifecycle.TERMINAL), Batch.deleted_at.is_(None)
        )
    )
    if (open_batches or 0) >= limit:
        noun = "open batch" if limit == 1 else "open batches"
        raise QuotaExceeded(
            f"This tenant has {open_batches} batches not yet ended, its quota of {limit} {noun}. "
            "Wait for one to end (or cancel one), or ask the operator for a larger quota."
        )
