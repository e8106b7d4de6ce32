"""Whether this worker process takes work now: what its `/ready` probe answers (infra/k8s, docs/scaling.md).

A GPU worker turns ready only once its engine is loaded and Celery consumes its queues (a 70B model
takes minutes to load, and a pod that is Running is not yet serving); it turns unready again as soon as
it is told to stop, so a rollout waits for the replacement to be warm before it counts it.
"""

from __future__ import annotations

import threading

_ready = threading.Event()


def is_ready() -> bool:
    """True between `mark_ready` and `mark_not_ready`."""
    return _ready.is_set()


def mark_ready() -> None:
    """The engine is warm and the worker consumes its queues."""
    _ready.set()


def mark_not_ready() -> None:
    """Stopping (or not started): take no more work."""
    _ready.clear()
