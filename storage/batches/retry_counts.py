"""What a batch's retries did, from their counts alone: the console's note on a retried batch and whether it
offers "Retry failed lines" again.

A line completes at most once in a retry tree (a retry never re-runs a success), and a retry below a batch
only ever holds that batch's lines, so the lines of a batch its retries fixed are the completed counts of
the retries below it: no result row is read, however large the batch or deep the tree. Lines a retry of an
ancestor fixed (a sibling branch) are not counted: the merged view has every line's latest attempt.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy.orm import Session

from storage import lifecycle
from storage.batches.retries import retry_family, retry_tree
from storage.models import Batch


@dataclass(frozen=True)
class RetryCounts:
    """A retry of the tree still running (its id: a new retry waits for it), how many of the batch's failed
    lines the retries below it completed, and how many failed lines that leaves."""

    running_retry: str | None
    succeeded: int
    failing: int

    def to_json(self) -> dict[str, Any]:
        """As the console reads it."""
        return {"running_retry": self.running_retry, "succeeded": self.succeeded, "failing": self.failing}


def retry_counts(session: Session, *, batch: Batch) -> RetryCounts:
    """The batch's retries in three numbers, from its tree's batch rows (one read)."""
    tree = retry_tree(session, batch=batch)
    running_retry = next((m.id for m in tree if m.id != batch.id and m.status not in lifecycle.TERMINAL), None)
    succeeded = sum(member.request_completed for member in retry_family(tree, batch=batch)[1:])
    return RetryCounts(running_retry, succeeded, max(0, batch.request_failed - succeeded))
