"""Result rows read back: the one reader of what a result line is made of (`result_columns`, `ResultRow`), over
a whole batch in line order (`iter_results`, finalize) or in numbered pages while it runs (`numbered_pages`); the
merged view of a batch and its retries (retry_rows.py) reads the same columns.

Pages while a batch runs:

A running batch's requests finish in any order, so a line-number cursor would skip a line that finishes
after a later one was read. Instead a reader numbers the finished requests no reader numbered yet
(`result_seq`), above every number given so far, in chunks that each take the batch's row lock briefly. A
request that commits after a read is numbered by a later read, above that read's cursor, so
`after=<number>` never skips nor repeats a line, whatever order results are recorded in.
Pages are short keyset reads, each in its own transaction: memory stays bounded however big the batch.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from sqlalchemy import func, select, text
from sqlalchemy.orm import Session

from storage import lifecycle
from storage.db import transaction
from storage.models import Batch, BatchRequest

PAGE_ROWS = 1000
_TERMINAL = tuple(sorted(lifecycle.REQ_TERMINAL))

NUMBER_CHUNK_ROWS = 500
_STATUSES = ", ".join(f"'{status}'" for status in _TERMINAL)
# The next chunk of finished, unnumbered rows in line order after `after_line`, numbered above `base`; the
# statement returns the chunk's lines (the next chunk starts after the last).
_NUMBER = text(
    f"""
    UPDATE batch_requests SET result_seq = :base + s.n
    FROM (
        SELECT id, row_number() OVER (ORDER BY line) AS n FROM (
            SELECT id, line FROM batch_requests
            WHERE batch_id = :batch_id AND line > :after_line AND result_seq IS NULL AND status IN ({_STATUSES})
            ORDER BY line LIMIT :rows
        ) AS chunk
    ) AS s
    WHERE batch_requests.id = s.id
    RETURNING batch_requests.line
    """
)


def number_results(*, batch_id: str, chunk_rows: int = NUMBER_CHUNK_ROWS) -> int:
    """Number the batch's finished requests no reader numbered yet; return the highest number given so far.

    Chunk by chunk in line order, each in its own short transaction under the batch's row lock (which a
    worker recording results also takes), so the lock is never held for long however many rows wait: two
    numberings of one batch interleave chunk by chunk and never hand out a number twice (each chunk numbers
    above the highest number at that moment). A row that finishes, in a line already passed, while this runs
    is numbered by the next read, above this read's cursor."""
    after_line = -1
    while True:
        with transaction() as session:
            session.execute(select(Batch.id).where(Batch.id == batch_id).with_for_update()).all()
            params = {"batch_id": batch_id, "after_line": after_line, "rows": chunk_rows}
            lines = list(session.scalars(_NUMBER, {**params, "base": _top(session, batch_id=batch_id)}))
            if len(lines) < chunk_rows:
                return _top(session, batch_id=batch_id)
        after_line = max(lines)


def _top(session: Session, *, batch_id: str) -> int:
    return int(session.scalar(select(func.max(BatchRequest.result_seq)).where(BatchRequest.batch_id == batch_id)) or 0)


# (id, custom_id, status code, body, error code, error message, checked attempts): what one result line is made of.
ResultRow = tuple[str, str, int | None, dict[str, Any] | None, str | None, str | None, dict[str, Any] | None]


def result_columns(table: Any = BatchRequest) -> tuple[Any, ...]:
    """The columns of a `ResultRow`, of `batch_requests` or an alias of it."""
    return (
        table.id,
        table.custom_id,
        table.response_status,
        table.response_body,
        table.error_code,
        table.error_message,
        table.check_attempts,
    )


def result_row(row: Any) -> ResultRow:
    """The first seven columns of a row read with `result_columns` (first) as a `ResultRow`."""
    return (row[0], row[1], row[2], row[3], row[4], row[5], row[6])


def iter_results(session: Session, *, batch_id: str, statuses: tuple[str, ...]) -> Iterator[ResultRow]:
    """The batch's finished requests in these statuses, in line order, streamed: what finalize writes."""
    query = (
        select(*result_columns())
        .where(BatchRequest.batch_id == batch_id, BatchRequest.status.in_(statuses))
        .order_by(BatchRequest.line)
        .execution_options(yield_per=1000)
    )
    for row in session.execute(query):
        yield result_row(row)


def numbered_pages(*, batch_id: str, after: int, upto: int, page_rows: int = PAGE_ROWS) -> Iterator[list[ResultRow]]:
    """The batch's finished requests numbered in (after, upto], page by page, each page its own read."""
    while after < upto:
        with transaction() as session:
            query = (
                select(*result_columns(), BatchRequest.result_seq)
                .where(
                    BatchRequest.batch_id == batch_id,
                    BatchRequest.result_seq > after,
                    BatchRequest.result_seq <= upto,
                )
                .order_by(BatchRequest.result_seq)
                .limit(page_rows)
            )
            rows = list(session.execute(query).all())
        if not rows:
            return
        after = int(rows[-1][-1])  # result_seq, after the result columns
        yield [result_row(r) for r in rows]
