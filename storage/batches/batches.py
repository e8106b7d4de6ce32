"""Batches: create, read, list, cancel; counts move with their requests."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from sqlalchemy import String, cast, select, update
from sqlalchemy.orm import Session

from storage import lifecycle
from storage.clock import now
from storage.errors import BatchNotFound
from storage.ids import new_id
from storage.models import Batch
from storage.paging import keyset_page
from storage.protocols import OPENAI, Protocol
from storage.quotas import check_batch_room
from storage.settings import get_settings
from storage.windows import deadline_for


def create_batch(
    session: Session,
    *,
    tenant_id: str,
    input_file_id: str,
    endpoint: str,
    completion_window: str,
    model: str | None,
    metadata: dict[str, str] | None,
    output_expires_after_seconds: int | None = None,
    protocol: Protocol = OPENAI,
    priority: int = 0,
    max_cost_micro_usd: int | None = None,
) -> Batch:
    """Record a new batch in `validating` (QuotaExceeded past the tenant's open batches); ingest validates its
    file and fills the queue. `priority` is checked against the tenant's cap by the caller (batch_control)."""
    check_batch_room(session, get_settings(), tenant_id=tenant_id)
    created = now()
    batch = Batch(
        id=new_id(protocol.id_prefix),
        protocol=protocol.name,
        tenant_id=tenant_id,
        input_file_id=input_file_id,
        endpoint=endpoint,
        completion_window=completion_window,
        model=model,
        status=lifecycle.VALIDATING,
        metadata_=metadata,
        output_expires_after_seconds=output_expires_after_seconds,
        max_cost_micro_usd=max_cost_micro_usd,
        created_at=created,
        expires_at=deadline_for(completion_window, created_at=created),
        priority=priority,
        request_total=0,
        request_completed=0,
        request_failed=0,
        request_cancelled=0,
        request_expired=0,
    )
    session.add(batch)
    session.flush()
    return batch


def get_batch(
    session: Session, *, tenant_id: str | None, batch_id: str, lock: bool = False, protocol: Protocol | None = None
) -> Batch:
    """The tenant's live batch (any tenant's, deleted or not, when tenant_id is None), or BatchNotFound; with
    `protocol`, only one created through that API. A deleted batch is missing to its tenant on every route."""
    query = select(Batch).where(Batch.id == batch_id)
    if lock:
        _lock_for_sqlite(session, batch_id=batch_id)
        # A locked read must see the row as it is now, not as this session loaded it before the lock
        # (cancel reads a `validating` batch, then waits while ingest queues it).
        query = query.with_for_update().execution_options(populate_existing=True)
    batch = session.scalar(query)
    if (
        batch is not None
        and protocol is not None
        and (not protocol.owns(batch.protocol) or batch.deleted_at is not None)
    ):
        batch = None
    if batch is None or (tenant_id is not None and (batch.tenant_id != tenant_id or batch.deleted_at is not None)):
        raise BatchNotFound(f"No batch found with id '{batch_id}'.", param="batch_id")
    return batch


def _lock_for_sqlite(session: Session, *, batch_id: str) -> None:
    """SQLite ignores FOR UPDATE: a no-op write takes its database write lock instead, so a cancel and an
    ingest of the same batch run one after the other (each sees what the other committed), as on Postgres."""
    if session.get_bind().dialect.name == "sqlite":
        session.execute(
            update(Batch).where(Batch.id == batch_id).values(id=Batch.id).execution_options(synchronize_session=False)
        )


def list_batches(session: Session, *, tenant_id: str, after: str | None, limit: int) -> list[Batch]:
    """The tenant's batches newest first, `limit + 1` rows so callers can tell if more exist."""
    query = select(Batch).where(Batch.tenant_id == tenant_id, Batch.protocol == OPENAI.name)
    found = session.get(Batch, after) if after else None
    anchor = (found.created_at, found.id) if found is not None and found.tenant_id == tenant_id else None
    return keyset_page(session, query, key=(Batch.created_at, Batch.id), anchor=anchor, limit=limit)


def search_batches(
    session: Session, *, tenant_id: str | None, status: str | None, query: str | None, after: str | None, limit: int
) -> list[Batch]:
    """The tenant's live batches of both protocols newest first (the console's list), `limit + 1` rows; `status`
    filters exactly, `query` matches part of the id or of the metadata's JSON text. `tenant_id` None: every
    tenant's (an admin key's console list, nothing else)."""
    statement = select(Batch).where(Batch.deleted_at.is_(None))
    if tenant_id is not None:
        statement = statement.where(Batch.tenant_id == tenant_id)
    if status:
        statement = statement.where(Batch.status == status)
    if query:
        pattern = "%" + query.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
        statement = statement.where(
            Batch.id.ilike(pattern, escape="\\") | cast(Batch.metadata_, String).ilike(pattern, escape="\\")
        )
    found = session.get(Batch, after) if after else None
    mine = found is not None and tenant_id in (None, found.tenant_id)
    anchor = (found.created_at, found.id) if found is not None and mine else None
    return keyset_page(session, statement, key=(Batch.created_at, Batch.id), anchor=anchor, limit=limit)


def batches_validating(session: Session) -> list[str]:
    """Ids of batches waiting for validation (ingest picks them up), but not those backing off a failed try."""
    due = (Batch.ingest_retry_at.is_(None)) | (Batch.ingest_retry_at <= now())
    return list(session.scalars(select(Batch.id).where(Batch.status == lifecycle.VALIDATING, due)))


def batch_errors(errors: list[dict[str, Any]] | None) -> dict[str, Any] | None:
    """OpenAI's `errors` object for a batch, or None."""
    if not errors:
        return None
    return {"object": "list", "data": errors}


def note_ingest_failure(session: Session, *, batch_id: str, reason: str, max_attempts: int, retry_seconds: int) -> bool:
    """Count a failed ingest of a `validating` batch: back off, or fail the batch after `max_attempts`.

    Returns True if the batch failed. `reason` (an error's type name) goes into the user-visible message.
    """
    batch = get_batch(session, tenant_id=None, batch_id=batch_id, lock=True)
    if batch.status != lifecycle.VALIDATING:
        return False
    batch.ingest_attempts = (batch.ingest_attempts or 0) + 1
    if batch.ingest_attempts < max_attempts:
        batch.ingest_retry_at = now() + retry_seconds * 2 ** (batch.ingest_attempts - 1)
        session.flush()
        return False
    message = (
        f"The input file could not be validated and enqueued after {batch.ingest_attempts} attempts ({reason}); "
        "nothing of this batch ran. Create a new batch to try again."
    )
    batch.errors = [{"code": "ingest_failed", "message": message, "param": None, "line": None}]
    lifecycle.transition(batch, lifecycle.FAILED)
    session.flush()
    return True


def record_model(batch: Batch, *, model: str | None) -> None:
    """Name the batch's model once ingest has read it (the first line was unreadable at create)."""
    batch.model = model


def mark_ingested(
    session: Session,
    *,
    batch: Batch,
    request_total: int,
    warnings: Iterable[dict[str, Any]] = (),
    predicted_finish_at: float | None = None,
) -> None:
    """A validated and admitted batch: its request count, admission's warnings and predicted finish, and
    `in_progress`."""
    batch.warnings = list(warnings) or None
    batch.predicted_finish_at = None if predicted_finish_at is None else round(predicted_finish_at)
    batch.request_total = request_total
    lifecycle.transition(batch, lifecycle.IN_PROGRESS)
    session.flush()


def fail_batch(batch: Batch, *, errors: list[dict[str, Any]]) -> None:
    """End a batch as `failed` with OpenAI's batch-level `errors.data` entries."""
    batch.errors = errors
    lifecycle.transition(batch, lifecycle.FAILED)


def attach_result_file(batch: Batch, *, kind: str, file_id: str) -> None:
    """Name a result file finalize wrote on its batch: the errors file, else the output (or results) file."""
    if kind == "errors":
        batch.error_file_id = file_id
    else:
        batch.output_file_id = file_id
