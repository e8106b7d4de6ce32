"""A batch's failed lines grouped by error code: how many, the first line numbers and a sample message each."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from storage import lifecycle
from storage.models import BatchRequest

LINES_PER_CODE = 50  # line numbers listed per code; `count` has them all

_FAILED = (lifecycle.REQ_FAILED, lifecycle.REQ_EXPIRED, lifecycle.REQ_CANCELLED)


@dataclass
class FailureGroup:
    """Failed lines of one error code: the count and the first lines with their messages."""

    code: str
    count: int
    lines: list[dict[str, Any]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        """The group as the console reads it."""
        return {"code": self.code, "count": self.count, "lines": self.lines}


def failures_by_code(session: Session, *, batch_id: str, lines_per_code: int = LINES_PER_CODE) -> list[FailureGroup]:
    """The batch's failed, expired and cancelled lines grouped by `error_code` (largest group first)."""
    failed = (BatchRequest.batch_id == batch_id) & BatchRequest.status.in_(_FAILED)
    code = func.coalesce(BatchRequest.error_code, BatchRequest.status)
    counts = session.execute(select(code, func.count()).where(failed).group_by(code)).all()
    groups = [FailureGroup(str(name), int(count)) for name, count in counts]
    groups.sort(key=lambda group: (-group.count, group.code))
    for group in groups:
        rows = session.execute(
            select(BatchRequest.line, BatchRequest.custom_id, BatchRequest.error_message)
            .where(failed, code == group.code)
            .order_by(BatchRequest.line)
            .limit(lines_per_code)
        ).all()
        group.lines = [{"line": line, "custom_id": custom_id, "message": message} for line, custom_id, message in rows]
    return groups
