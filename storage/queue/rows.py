"""Queue rows: filling the queue at ingest (COPY on Postgres), id matching, and the batch-before-request
lock order shared by every queue statement."""

from __future__ import annotations

from typing import Any, cast

import orjson
from sqlalchemy import ARRAY, String, Table, any_, bindparam, insert, literal, select, text
from sqlalchemy.orm import Session

from storage import lifecycle
from storage.ids import new_id
from storage.lines import ParsedLine
from storage.models import Batch, BatchRequest
from storage.planning.shapes import request_size


def ids_match(session: Session, ids: list[str]) -> Any:
    """`id IN (...)`; on Postgres one array parameter, so the statement text (and its plan) never varies."""
    if session.get_bind().dialect.name == "postgresql":
        return BatchRequest.id == any_(literal(ids, ARRAY(String)))
    return BatchRequest.id.in_(ids)


def lock_batches_of(session: Session, *, request_ids: list[str]) -> None:
    """Lock the batches of these requests, in id order, before touching the requests themselves.

    Every transaction that changes both a batch and its requests takes the batch first (cancel, expiry,
    finalize, recording results), so they can wait on each other but never deadlock.
    """
    batch_ids = select(BatchRequest.batch_id).where(ids_match(session, request_ids)).distinct()
    session.execute(select(Batch.id).where(Batch.id.in_(batch_ids)).order_by(Batch.id).with_for_update()).all()


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
    "prefix_key",
    "est_input_tokens",
    "max_output_tokens",
    "attempts",
    "prompt_tokens",
    "completion_tokens",
    "engine_seconds",
)


def insert_rows(session: Session, rows: list[dict[str, Any]]) -> None:
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


def set_prefix_keys(session: Session, keys: list[tuple[str, str]]) -> None:
    """Give already inserted rows their prefix key: the first row of each prefix a later row shared."""
    table = cast(Table, BatchRequest.__table__)
    statement = table.update().where(table.c.id == bindparam("b_id")).values(prefix_key=bindparam("b_key"))
    session.execute(statement, [{"b_id": row_id, "b_key": key} for row_id, key in keys])


def new_row(batch: Batch, line: ParsedLine, *, line_bytes: int) -> dict[str, Any]:
    """A queued row for a valid line, sized once here so nothing later parses its body to plan."""
    input_tokens, output_tokens = request_size(line.url, line.body, line_bytes=line_bytes)
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
        "prefix_key": "",  # set by SharedPrefixes
        "est_input_tokens": input_tokens,
        "max_output_tokens": output_tokens,
        "attempts": 0,
        "prompt_tokens": 0,
        "completion_tokens": 0,
        "engine_seconds": 0.0,
    }


def refresh_statistics(session: Session) -> None:
    """Re-sample the queue table after a big ingest, so claims use the queue indexes at once.

    Postgres' autovacuum would get there within a minute or so; until then the planner believes the
    queue is tiny, picks the wrong index for a tenant's claim and each claim costs several times more
    (measured: 2,400 vs 5,000 claims+results per second on 20,000 fresh rows). SQLite has no such issue.
    """
    if session.get_bind().dialect.name != "postgresql":
        return
    session.execute(text("ANALYZE batch_requests"))
