"""Wall-clock time in one place so tests and code agree on units (seconds since the epoch)."""

from __future__ import annotations

import time


def now() -> int:
    """Whole seconds since the epoch, as OpenAI's `*_at` fields use."""
    return int(time.time())


def now_f() -> float:
    """Fractional seconds since the epoch, for leases and measurements."""
    return time.time()
