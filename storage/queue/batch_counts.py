"""A batch's live request counts, moved by the queue as its rows end (completed, failed, cancelled, expired).

The counts are columns of `batches`, but only the queue ends requests, so the queue owns their increments.
"""

from __future__ import annotations

import orjson
from sqlalchemy import text, update
from sqlalchemy.orm import Session

from storage.models import Batch


def add_counts(
    session: Session, *, batch_id: str, completed: int, failed: int, cancelled: int = 0, expired: int = 0
) -> None:
    """Move a batch's live request counts (an atomic increment, safe with concurrent workers); `cancelled`
    and `expired` say how many of `failed` ended that way."""
    session.execute(
        update(Batch)
        .where(Batch.id == batch_id)
        .values(
            request_completed=Batch.request_completed + completed,
            request_failed=Batch.request_failed + failed,
            request_cancelled=Batch.request_cancelled + cancelled,
            request_expired=Batch.request_expired + expired,
        )
        .execution_options(synchronize_session=False)
    )


_ADD_COUNTS_JSON = text(
    """
    UPDATE batches AS b SET request_completed = b.request_completed + v.completed,
        request_failed = b.request_failed + v.failed
    FROM json_to_recordset(CAST(:counts AS json)) AS v(id text, completed int, failed int)
    WHERE b.id = v.id
    """
)


def add_counts_of(session: Session, counts: dict[str, tuple[int, int]]) -> None:
    """`add_counts` for several batches at once, {batch_id: (completed, failed)}: one statement on Postgres
    (a worker's flush of results touches tens of batches), one per batch elsewhere."""
    if not counts:
        return
    if session.get_bind().dialect.name != "postgresql":
        for batch_id, (completed, failed) in counts.items():
            add_counts(session, batch_id=batch_id, completed=completed, failed=failed)
        return
    rows = [
        {"id": batch_id, "completed": completed, "failed": failed} for batch_id, (completed, failed) in counts.items()
    ]
    session.execute(_ADD_COUNTS_JSON, {"counts": orjson.dumps(rows).decode()})
