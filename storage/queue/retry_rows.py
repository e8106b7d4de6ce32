"""Queue rows of retry trees: the latest failures a retry re-runs, its copies, and the merged view's rows.

A retry copies failed rows (same line, custom_id and body) under its own batch and marks each source
`superseded`; the original batch's row of that line points at its newest copy (`latest_copy`). So a line's
rows that are not superseded are its latest attempt, a retry reads only those failures (an index holds
`superseded`), and the merged view reads one row per line: each costs what its lines cost, not the tree's size.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, cast

import orjson
from sqlalchemy import ColumnElement, Table, bindparam, false, func, select, text, update
from sqlalchemy.orm import Session, aliased

from storage import lifecycle
from storage.db import transaction
from storage.ids import IdPool
from storage.models import Batch, BatchRequest
from storage.queue.enqueue import insert_rows
from storage.queue.result_rows import ResultRow, result_columns, result_row

_ROW_IDS = IdPool("batch_req_")
_FAILED = (lifecycle.REQ_FAILED, lifecycle.REQ_EXPIRED, lifecycle.REQ_CANCELLED)
_TERMINAL = tuple(sorted(lifecycle.REQ_TERMINAL))
PAGE_ROWS = 1000

# A latest failure: (request id, status, response status, error code).
Failure = tuple[str, str, int | None, str | None]


def latest_failures(session: Session, *, tree: list[str], lines_of: str | None) -> list[Failure]:
    """The rows of the tree's batches (`tree`: their ids) that are the latest attempt of their line and ended
    failed, expired or cancelled, in line order; with `lines_of`, only lines that batch holds. Read off the
    (batch_id, status, superseded) index: earlier attempts are not read at all."""
    query = (
        select(BatchRequest.id, BatchRequest.status, BatchRequest.response_status, BatchRequest.error_code)
        .where(
            BatchRequest.batch_id.in_(tree),
            BatchRequest.status.in_(_FAILED),
            BatchRequest.superseded == false(),
        )
        .order_by(BatchRequest.line)
    )
    if lines_of is not None:
        held = aliased(BatchRequest)
        query = query.where(BatchRequest.line.in_(select(held.line).where(held.batch_id == lines_of)))
    return [(rid, status, code, error) for rid, status, code, error in session.execute(query).all()]


def requeue_copies(session: Session, *, batch: Batch, root_id: str, request_ids: list[str]) -> int:
    """Queue a copy of each of these finished requests under the retry `batch` (same line, custom_id and body;
    the batch's deadline; no result), mark each source superseded and point the original row of its line
    (`root_id`'s) at the copy. A source already superseded (another retry took it) is skipped. How many."""
    if not request_ids:
        return 0
    sources = session.execute(
        update(BatchRequest)
        .where(BatchRequest.id.in_(request_ids), BatchRequest.superseded == false())
        .values(superseded=True)
        .returning(
            BatchRequest.id,
            BatchRequest.line,
            BatchRequest.custom_id,
            BatchRequest.model,
            BatchRequest.url,
            BatchRequest.body,
            BatchRequest.prefix_key,
            BatchRequest.est_input_tokens,
            BatchRequest.max_output_tokens,
            BatchRequest.adapter,
        )
        .execution_options(synchronize_session=False)
    ).all()
    rows: list[dict[str, Any]] = [
        {
            "id": _ROW_IDS.next(),
            "batch_id": batch.id,
            "tenant_id": batch.tenant_id,
            "line": line,
            "custom_id": custom_id,
            "model": model,
            "url": url,
            "body": body,
            "status": lifecycle.REQ_INITIAL,
            "deadline": batch.expires_at,
            "prefix_key": prefix_key,
            "est_input_tokens": est_input,
            "max_output_tokens": max_output,
            "attempts": 0,
            "prompt_tokens": 0,
            "completion_tokens": 0,
            "engine_seconds": 0.0,
            "copy_of": source,
            "adapter": adapter,
        }
        for source, line, custom_id, model, url, body, prefix_key, est_input, max_output, adapter in sources
    ]
    insert_rows(session, rows)
    _point_at_copies(session, root_id=root_id, copies=[(row["line"], row["id"]) for row in rows])
    return len(rows)


_POINT_AT_COPIES = text(
    """
    UPDATE batch_requests AS r SET latest_copy = v.copy
    FROM json_to_recordset(CAST(:copies AS json)) AS v(line int, copy text)
    WHERE r.batch_id = :root AND r.line = v.line
    """
)


def _point_at_copies(session: Session, *, root_id: str, copies: list[tuple[int, str]]) -> None:
    """Point the original's row of each line at its newest copy: one statement on Postgres, an executemany
    by (batch, line) elsewhere."""
    if session.get_bind().dialect.name == "postgresql":
        payload = orjson.dumps([{"line": line, "copy": copy} for line, copy in copies]).decode()
        session.execute(_POINT_AT_COPIES, {"copies": payload, "root": root_id})
        return
    table = cast(Table, BatchRequest.__table__)  # Core: by (batch, line), not the ORM's by primary key
    session.execute(
        table.update()
        .where(table.c.batch_id == root_id, table.c.line == bindparam("b_line"))
        .values(latest_copy=bindparam("b_copy")),
        [{"b_line": line, "b_copy": copy} for line, copy in copies],
    )


# One merged row: the result row, its status and its line (the origin's line number, kept by every retry).
MergedRow = tuple[ResultRow, str, int]


def _columns(table: Any) -> tuple[ColumnElement[Any], ...]:
    return (*result_columns(table), table.status, table.line, table.batch_id, table.copy_of)


# Where the columns after the result row's sit in a `_columns` row.
_STATUS = len(result_columns())
_LINE, _COPY_OF = _STATUS + 1, _STATUS + 3


def merged_pages(
    *, tree: dict[str, int], root_id: str, batch_id: str, limit: int | None = None, page_rows: int = PAGE_ROWS
) -> Iterator[list[MergedRow]]:
    """Each line `batch_id` holds once, in line order, from the latest attempt over the tree that finished it
    (`tree`: {batch_id: attempt}); page by page, each page its own read of one row per line (and, for lines a
    running retry holds, of their earlier attempts). At most `limit` lines."""
    after, left = -1, limit
    while left is None or left > 0:
        size = page_rows if left is None else min(page_rows, left)
        with transaction() as session:
            rows = _latest_rows(session, root_id=root_id, batch_id=batch_id, after=after, size=size)
            running = [
                row[_COPY_OF]
                for row in rows
                if row[_STATUS] not in lifecycle.REQ_TERMINAL and row[_COPY_OF] is not None
            ]
            earlier = _finished_attempts(session, copies_of=running) if running else {}
        if not rows:
            return
        after = rows[-1][_LINE]
        page = []
        for row in rows:
            found = row if row[_STATUS] in lifecycle.REQ_TERMINAL else earlier.get(row[_LINE])
            if found is not None:
                page.append((result_row(found), found[_STATUS], found[_LINE]))
        if page:
            yield page
        if left is not None:
            left -= len(page)
        if len(rows) < size:
            return


def _latest_rows(session: Session, *, root_id: str, batch_id: str, after: int, size: int) -> list[Any]:
    """The next `size` lines of `batch_id` after line `after`, each as its latest row in the tree."""
    held = aliased(BatchRequest)
    origin = aliased(BatchRequest)
    latest = aliased(BatchRequest)
    query = select(*_columns(latest))
    if batch_id == root_id:
        query = query.select_from(origin).where(origin.batch_id == root_id, origin.line > after)
    else:
        query = (
            query.select_from(held)
            .join(origin, (origin.batch_id == root_id) & (origin.line == held.line))
            .where(held.batch_id == batch_id, held.line > after)
        )
    query = query.join(latest, latest.id == func.coalesce(origin.latest_copy, origin.id))
    return list(session.execute(query.order_by(origin.line).limit(size)).all())


def _finished_attempts(session: Session, *, copies_of: list[str]) -> dict[int, Any]:
    """{line: its previous attempt} for lines whose newest copy still runs: the rows those copies copied."""
    query = select(*_columns(BatchRequest)).where(BatchRequest.id.in_(copies_of))
    return {row[_LINE]: row for row in session.execute(query).all()}
