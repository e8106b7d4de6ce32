"""Wake workers after commit. Postgres is the queue of record; a wake-up only saves a poll.

Code inside a transaction calls `wake_after_commit`; the message is sent only if the transaction
commits (and dropped on rollback). Celery mode sends a task by name; the embedded default sets an event.
"""

from __future__ import annotations

import logging
import threading
from functools import lru_cache
from typing import Any, Protocol

from sqlalchemy import event
from sqlalchemy.orm import Session

log = logging.getLogger(__name__)

_KEY = "backfill_wakeups"


class Waker(Protocol):
    def send(self, task: str, kwargs: dict[str, Any]) -> None: ...


class EventWaker:
    """The embedded default: one in-process worker loop waiting on an event."""

    def __init__(self) -> None:
        self.event = threading.Event()
        # A batch to ingest: the loop's engine time slice ends early, so its lines join the running batch now rather
        # than after the slice (8 jobs created together otherwise reached the engine a slice apart).
        self.interrupt = threading.Event()

    def send(self, task: str, kwargs: dict[str, Any]) -> None:
        if task == "batch.ingest":
            self.interrupt.set()
        self.event.set()


class CeleryWaker:
    """Send tasks by name: the API never imports the worker package."""

    def __init__(self, broker_url: str) -> None:
        from celery import Celery

        self.app = Celery("backfill-client", broker=broker_url)

    def send(self, task: str, kwargs: dict[str, Any]) -> None:
        queue = f"gpu.{kwargs['model']}" if task == "batch.run" else "default"
        self.app.send_task(task, kwargs=kwargs, queue=queue)


_waker: list[Waker] = []


def set_waker(waker: Waker) -> None:
    """Install the process's waker (the CLI does this at start)."""
    _waker[:] = [waker]


@lru_cache(maxsize=1)
def _default_waker() -> Waker:
    from storage.settings import get_settings

    settings = get_settings()
    return CeleryWaker(settings.redis_url) if settings.redis_url else EventWaker()


def get_waker() -> Waker:
    """The installed waker, else one built from settings."""
    return _waker[0] if _waker else _default_waker()


def wake_after_commit(session: Session, task: str, **kwargs: Any) -> None:
    """Queue a wake-up to send once `session` commits."""
    session.info.setdefault(_KEY, []).append((task, kwargs))


@event.listens_for(Session, "after_commit")
def _send(session: Session) -> None:
    for task, kwargs in session.info.pop(_KEY, []):
        try:
            get_waker().send(task, kwargs)
        except Exception:  # a lost wake-up only delays work: beat re-wakes from the database
            log.exception("could not send wake-up %s", task)


@event.listens_for(Session, "after_rollback")
def _drop(session: Session) -> None:
    session.info.pop(_KEY, None)
