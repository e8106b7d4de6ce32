"""A checked line's draws so far (docs/workflow.md, "Checked answers"), kept with its queue row.

A worker draws an answer that fails its batch's checks again at once, in the same engine (worker/feed/redraws.py);
at each redraw it also writes here the draws that failed so far, which check each failed and their usage, in the
write that drops the failed draw's checkpoint (worker/feed/writes.py `drop_checkpoints`). A line handed back
before its result is stored (a pause, a drain, a lease lost) keeps them: the claim that takes it next reads them
(storage/queue/claim.py) and goes on with the next draw, so a line makes at most `max_attempts` draws and its
result lists and bills every draw it made, whichever claim made it. Like a checkpoint, a write lands only while
the row is open and still under the claim that made the draws: a late write never lands on a later claim's row.

Stored as `{"failed": [{"attempt", "check", "message"}, ...], "usage": {"prompt_tokens", "completion_tokens",
"cached_tokens"}}`; never shown (a result line shows `check_attempts`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from storage import lifecycle
from storage.models import BatchRequest
from storage.queue.enqueue import ids_match

_USAGE = ("prompt_tokens", "completion_tokens", "cached_tokens")


@dataclass(frozen=True)
class Draws:
    """The draws of a line that failed its checks, in order, and the tokens they spent."""

    failed: tuple[dict[str, Any], ...] = ()
    usage: dict[str, int] = field(default_factory=lambda: dict.fromkeys(_USAGE, 0))

    def stored(self) -> dict[str, Any]:
        """As the row holds it."""
        return {"failed": list(self.failed), "usage": {key: int(self.usage.get(key, 0)) for key in _USAGE}}


def draws_of(value: dict[str, Any] | None) -> Draws:
    """A row's stored draws (none for a row that has none, or a value this version cannot read)."""
    if not isinstance(value, dict) or not isinstance(value.get("failed"), list):
        return Draws()
    usage = value.get("usage")
    if not isinstance(usage, dict):
        usage = {}
    failed = tuple(item for item in value["failed"] if isinstance(item, dict))
    return Draws(failed, {key: int(usage.get(key) or 0) for key in _USAGE})


def save_draws(session: Session, *, draws: Mapping[str, tuple[str, Draws]]) -> set[str]:
    """Store these rows' draws (id -> the claim that made them, the draws); return the ids stored: only rows still
    open and under that claim."""
    saved: set[str] = set()
    for rid, (claim_id, drawn) in sorted(draws.items()):
        result = session.scalars(
            update(BatchRequest)
            .where(
                BatchRequest.id == rid,
                BatchRequest.status.in_(sorted(lifecycle.REQ_OPEN)),
                BatchRequest.claim_id == claim_id,
            )
            .values(draws=drawn.stored())
            .returning(BatchRequest.id)
            .execution_options(synchronize_session=False)
        )
        saved |= set(result)
    return saved


def carry_draws(session: Session, *, copies: Mapping[str, str]) -> None:
    """Give fresh copies (copy id -> the row it copies: a continuation's, storage/batches/continuation.py) their
    source's draws, as they take its checkpoint: the copy goes on with the draw the source was making."""
    if not copies:
        return
    stored: dict[str, Any] = dict(
        session.execute(
            select(BatchRequest.id, BatchRequest.draws).where(
                ids_match(session, sorted(set(copies.values()))), BatchRequest.draws.is_not(None)
            )
        ).all()
    )
    for copy, source in sorted(copies.items()):
        if (value := stored.get(source)) is not None:
            session.execute(
                update(BatchRequest)
                .where(BatchRequest.id == copy)
                .values(draws=value)
                .execution_options(synchronize_session=False)
            )
