"""Ingest: stream a batch's input file once, report every bad line, or fill the queue.

Rows are inserted in chunks inside a savepoint while checking; any bad line rolls the savepoint back,
so a rejected file leaves no queue rows and costs no compute.
"""

from __future__ import annotations

import logging
from typing import Any

import orjson
from sqlalchemy import insert
from sqlalchemy.orm import Session

from storage import lifecycle
from storage.batch_lines import LineChecker, LineError, ParsedLine, iter_lines
from storage.batches import get_batch
from storage.blobs import BlobStore
from storage.errors import FileNotFound
from storage.files import get_file
from storage.ids import new_id
from storage.models import Batch, BatchRequest
from storage.settings import Settings

log = logging.getLogger(__name__)

INSERT_CHUNK = 2000


def ingest_batch(session: Session, blobs: BlobStore, settings: Settings, *, batch_id: str) -> str:
    """Validate a `validating` batch and enqueue its lines; return the batch's new status."""
    batch = get_batch(session, tenant_id=None, batch_id=batch_id, lock=True)
    if batch.status != lifecycle.VALIDATING:
        return batch.status  # already ingested (or cancelled): tasks are idempotent
    try:
        source = get_file(session, tenant_id=batch.tenant_id, file_id=batch.input_file_id)
    except FileNotFound:
        return _fail(batch, [LineError(0, "file_not_found", "The input file was deleted.")])
    errors: list[LineError] = []
    savepoint = session.begin_nested()
    count = _stream_into_queue(session, blobs, settings, batch=batch, blob_key=source.blob_key, errors=errors)
    if not errors and count == 0:
        errors.append(LineError(0, "empty_file", "The input file has no requests."))
    if not errors and batch.model not in settings.served_models():
        errors.append(LineError(1, "model_not_found", f"The model '{batch.model}' is not served here."))
    if errors:
        savepoint.rollback()
        return _fail(batch, errors)
    savepoint.commit()
    batch.request_total = count
    lifecycle.transition(batch, lifecycle.IN_PROGRESS)
    session.flush()
    log.info("batch %s ingested: %d requests", batch.id, count)
    return batch.status


def _stream_into_queue(
    session: Session,
    blobs: BlobStore,
    settings: Settings,
    *,
    batch: Batch,
    blob_key: str,
    errors: list[LineError],
) -> int:
    checker = LineChecker(endpoint=batch.endpoint, max_requests=settings.batch_max_requests)
    pending: list[dict[str, Any]] = []
    chunks = blobs.open_stream(blob_key, chunk_bytes=settings.stream_chunk_bytes)
    for number, raw in iter_lines(chunks, max_line_bytes=settings.line_max_bytes):
        outcome = checker.check(number, raw, max_line_bytes=settings.line_max_bytes)
        if isinstance(outcome, LineError):
            errors.append(outcome)
        elif isinstance(outcome, ParsedLine) and not errors:
            pending.append(_row(batch, outcome))
            if len(pending) >= INSERT_CHUNK:
                _insert(session, pending)
                pending.clear()
    if pending and not errors:
        _insert(session, pending)
    if checker.model is not None:
        batch.model = checker.model
    return len(checker.custom_ids)


_COPY_COLUMNS = (
    "id",
    "batch_id",
    "tenant_id",
    "line",
    "custom_id",
    "model",
    "url",
    "body",
    "status",
    "deadline",
    "attempts",
    "prompt_tokens",
    "completion_tokens",
    "engine_seconds",
)


def _insert(session: Session, rows: list[dict[str, Any]]) -> None:
    """Insert queue rows: COPY on Postgres (several times faster for 200 MB files), else executemany."""
    connection = session.connection()
    if connection.dialect.name != "postgresql":
        session.execute(insert(BatchRequest), rows)
        return
    raw = connection.connection.driver_connection
    assert raw is not None  # a live psycopg connection inside this transaction
    with raw.cursor() as cursor, cursor.copy(f"COPY batch_requests ({', '.join(_COPY_COLUMNS)}) FROM STDIN") as copy:
        for row in rows:
            copy.write_row([orjson.dumps(row[c]).decode() if c == "body" else row[c] for c in _COPY_COLUMNS])


def _row(batch: Batch, line: ParsedLine) -> dict[str, Any]:
    return {
        "id": new_id("batch_req_"),
        "batch_id": batch.id,
        "tenant_id": batch.tenant_id,
        "line": line.line,
        "custom_id": line.custom_id,
        "model": line.model,
        "url": line.url,
        "body": line.body,
        "status": lifecycle.REQ_QUEUED,
        "deadline": batch.expires_at,
        "attempts": 0,
        "prompt_tokens": 0,
        "completion_tokens": 0,
        "engine_seconds": 0.0,
    }


def _fail(batch: Batch, errors: list[LineError]) -> str:
    batch.errors = [error.to_json() for error in errors]
    lifecycle.transition(batch, lifecycle.FAILED)
    log.info("batch %s failed validation: %d bad lines", batch.id, len(errors))
    return batch.status
