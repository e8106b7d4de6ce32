"""Public ids: prefixed and opaque, but time-ordered so that listing by id lists by creation."""

from __future__ import annotations

import os
import secrets
import threading
import time

_lock = threading.Lock()
_last = [0]


def new_id(prefix: str) -> str:
    """Return an id like 'batch_0625f1c2a4b9e1a3…': 14 hex digits of microseconds, then 10 random."""
    with _lock:
        stamp = max(time.time_ns() // 1000, _last[0] + 1)  # strictly increasing within the process
        _last[0] = stamp
    return f"{prefix}{stamp:014x}{secrets.token_hex(5)}"


def new_ids(prefix: str, count: int) -> list[str]:
    """`count` ids as `new_id` makes them, in order, with one lock and one read of the random source."""
    with _lock:
        first = max(time.time_ns() // 1000, _last[0] + 1)
        _last[0] = first + count - 1
    noise = os.urandom(5 * count).hex()
    return [f"{prefix}{first + i:014x}{noise[10 * i : 10 * i + 10]}" for i in range(count)]


class IdPool:
    """Hands out `new_id`-style ids drawn `batch` at a time (ingest makes one per line)."""

    def __init__(self, prefix: str, *, batch: int = 2000) -> None:
        self.prefix, self.batch = prefix, batch
        self._ids: list[str] = []
        self._lock = threading.Lock()

    def next(self) -> str:
        """The next id (thread-safe: io workers ingest on several threads)."""
        with self._lock:
            if not self._ids:
                self._ids = new_ids(self.prefix, self.batch)[::-1]
            return self._ids.pop()
