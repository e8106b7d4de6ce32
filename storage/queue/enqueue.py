"""Queue rows: filling the queue at ingest (COPY on Postgres), id matching, and the batch-before-request
lock order shared by every queue statement."""

from __future__ import annotations

from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any, cast

import orjson
from psycopg.copy import QueuedLibpqWriter
from psycopg.errors import UniqueViolation
from sqlalchemy import String, Table, any_, bindparam, func, insert, literal, select, text
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from storage import lifecycle
from storage.ids import IdPool
from storage.lines.reader import ParsedLine
from storage.models import Batch, BatchRequest, Tenant
from storage.planning.shapes import request_size


def ids_match(session: Session, ids: list[str]) -> Any:
    """`id IN (...)`; on Postgres one text parameter split by the server, so the statement text (and its plan)
    never varies and no array is quoted element by element in Python (a third of a claim's client time)."""
    if session.get_bind().dialect.name == "postgresql":
        return BatchRequest.id == any_(id_array(ids))
    return BatchRequest.id.in_(ids)


def id_array(ids: list[str]) -> Any:
    """A Postgres text[] of queue ids sent as one comma-joined string (ids are prefix + hex: no commas)."""
    return func.string_to_array(literal(",".join(ids), String), literal(",", String))


@dataclass(frozen=True)
class LockedBatches:
    """What `lock_batches_of` read of the batches it locked: which are paused, and which have a spend cap or a
    tenant with a monthly budget. Exact on Postgres, where the lock keeps both as read until commit; SQLite's
    lock is no lock (its write lock comes with the first write), so there every batch may be either."""

    paused: frozenset[str]
    capped: frozenset[str]


def lock_batches_of(session: Session, *, request_ids: list[str]) -> LockedBatches:
    """Lock the batches of these requests, in id order, before touching the requests themselves.

    Every transaction that changes both a batch and its requests takes the batch first (cancel, expiry,
    finalize, recording results), so they can wait on each other but never deadlock. The same statement reads
    what a results transaction needs to know of them (`LockedBatches`): most have nothing paused or capped,
    and then the statements that handle those cases can be left out.
    """
    batch_ids = select(BatchRequest.batch_id).where(ids_match(session, request_ids)).distinct()
    capped = Batch.max_cost_micro_usd.is_not(None) | Tenant.monthly_budget_micro_usd.is_not(None)
    rows = session.execute(
        select(Batch.id, Batch.paused_at.is_not(None), capped)
        .outerjoin(Tenant, Tenant.id == Batch.tenant_id)
        .where(Batch.id.in_(batch_ids))
        .order_by(Batch.id)
        .with_for_update(of=Batch)  # the batches only: a tenant's row is never locked here
    ).all()
    if session.get_bind().dialect.name != "postgresql":
        every = frozenset(row[0] for row in rows)
        return LockedBatches(paused=every, capped=every)
    return LockedBatches(
        paused=frozenset(row[0] for row in rows if row[1]), capped=frozenset(row[0] for row in rows if row[2])
    )


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


class DuplicateCustomId(Exception):
    """The queue's unique index on (batch_id, custom_id) refused a row: the file repeats a custom_id."""


_UNIQUE_CUSTOM_ID = "uq_batch_requests_batch_id_custom_id"


def _is_duplicate_custom_id(error: BaseException) -> bool:
    if isinstance(error, UniqueViolation):
        return error.diag.constraint_name == _UNIQUE_CUSTOM_ID
    if isinstance(error, IntegrityError):  # SQLite names the columns, not the constraint
        text = str(error.orig)
        return _UNIQUE_CUSTOM_ID in text or "batch_requests.batch_id, batch_requests.custom_id" in text
    return False


class QueueWriter:
    """Streams new queue rows into the table for one ingest: on Postgres one COPY for the whole file.

    One COPY left open while the file is read lets the server store rows while the next lines are parsed
    and checked; a COPY per chunk made each chunk wait for the server to finish the last (measured: the
    client idled ~40% of an ingest). Rows go through psycopg's queued writer, so even the socket writes
    leave the checking thread. Elsewhere (SQLite) rows go in with executemany per `write`.
    Use as a context manager inside the ingest's savepoint; nothing else may use the session until it ends.
    A repeated custom_id raises `DuplicateCustomId` (from `write` or on leaving): roll the savepoint back.
    """

    def __init__(self, session: Session, *, columns: tuple[str, ...] = _COPY_COLUMNS) -> None:
        self.session = session
        self.columns = columns  # the keys of every row written (COPY names them)
        self._copy: Any = None
        self._stack: ExitStack | None = None

    def __enter__(self) -> QueueWriter:
        connection = self.session.connection()
        if connection.dialect.name == "postgresql":
            raw = connection.connection.driver_connection
            assert raw is not None  # a live psycopg connection inside this transaction
            self._stack = ExitStack()
            cursor = self._stack.enter_context(raw.cursor())
            statement = f"COPY batch_requests ({', '.join(self.columns)}) FROM STDIN"
            self._copy = self._stack.enter_context(cursor.copy(statement, writer=QueuedLibpqWriter(cursor)))
        return self

    def write(self, rows: list[dict[str, Any]]) -> None:
        """Add rows (in the order given)."""
        if self._copy is None:
            if rows:
                try:
                    self.session.execute(insert(BatchRequest), rows)
                except IntegrityError as error:
                    if _is_duplicate_custom_id(error):
                        raise DuplicateCustomId(str(error.orig)) from error
                    raise
            return
        for row in rows:
            self._copy.write_row([orjson.dumps(row[c]).decode() if c == "body" else row[c] for c in self.columns])

    def __exit__(self, *exc: object) -> None:
        if self._stack is not None:
            try:
                self._stack.__exit__(*exc)  # type: ignore[arg-type]
            except UniqueViolation as error:  # COPY reports it when the copy ends
                if _is_duplicate_custom_id(error):
                    raise DuplicateCustomId(str(error)) from error
                raise


def insert_rows(session: Session, rows: list[dict[str, Any]]) -> None:
    """Insert queue rows in one go (a `QueueWriter` for a single batch of rows, all with the same keys)."""
    if not rows:
        return
    with QueueWriter(session, columns=tuple(rows[0])) as writer:
        writer.write(rows)


def set_prefix_keys(session: Session, *, batch_id: str, keys: list[tuple[int, str]]) -> None:
    """Give already inserted rows their prefix key, by (line number, key): the first row of each prefix a
    later row of the batch shared."""
    table = cast(Table, BatchRequest.__table__)
    statement = (
        table.update()
        .where(table.c.batch_id == batch_id, table.c.line == bindparam("b_line"))
        .values(prefix_key=bindparam("b_key"))
    )
    session.execute(statement, [{"b_line": line, "b_key": key} for line, key in keys])


_ROW_IDS = IdPool("batch_req_")


def new_row(batch: Batch, line: ParsedLine, *, line_bytes: int) -> dict[str, Any]:
    """A queued row for a valid line, sized once here so nothing later parses its body to plan."""
    input_tokens, output_tokens = request_size(line.url, line.body, line_bytes=line_bytes)
    return {
        "id": _ROW_IDS.next(),
        "batch_id": batch.id,
        "tenant_id": batch.tenant_id,
        "line": line.line,
        "custom_id": line.custom_id,
        "model": line.model,
        "url": line.url,
        "body": line.body,
        "status": lifecycle.REQ_INITIAL,
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
