"""Batch endings this process commits, for long-polls (`GET /v1/batches/{id}/wait`): a waiter wakes the moment a
batch ends here instead of at its next look at the database.

`transition` notes an end state on the batch's session; the note is published only when that transaction commits
(dropped on rollback), like a worker wake-up (wakeups.py). A process that ends no batches itself (an API beside
Celery workers) publishes nothing: its waiters look at the database every few tenths of a second instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from sqlalchemy import event
from sqlalchemy.orm import Session

_KEY = "backfill_batch_endings"
_lock = threading.Lock()
_waiters: set[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = set()


def note_ending(session: Session) -> None:
    """Publish an ending once `session` commits (one note per transaction is enough: waiters re-read)."""
    session.info[_KEY] = True


@asynccontextmanager
async def endings() -> AsyncIterator[asyncio.Event]:
    """An event set whenever a transaction of this process that ended a batch commits, from entry on.

    Clear it *before* reading a batch's status: an ending committed between the read and the wait still wakes."""
    entry = (asyncio.get_running_loop(), asyncio.Event())
    with _lock:
        _waiters.add(entry)
    try:
        yield entry[1]
    finally:
        with _lock:
            _waiters.discard(entry)


def waiting() -> int:
    """Waiters registered now."""
    with _lock:
        return len(_waiters)


@event.listens_for(Session, "after_commit")
def _publish(session: Session) -> None:
    if session.info.pop(_KEY, False):
        with _lock:
            entries = list(_waiters)
        for loop, ended in entries:
            with contextlib.suppress(RuntimeError):  # that loop closed (a stopped server): nobody waits on it
                loop.call_soon_threadsafe(ended.set)


@event.listens_for(Session, "after_rollback")
def _drop(session: Session) -> None:
    session.info.pop(_KEY, None)
