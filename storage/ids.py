"""Public ids: prefixed and opaque, but time-ordered so that listing by id lists by creation."""

from __future__ import annotations

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
