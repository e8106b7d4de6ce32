"""A worker told to stop (SIGTERM: a pod deleted, a rollout, a drained node) hands its in-flight work back.

Without this the rows a GPU worker holds stay leased to a dead process until their leases expire
(`lease_seconds`, then the reaper), and the reaper counts the interruption as an attempt. Instead, on
SIGTERM the worker stops claiming (the running `batch.run` task returns after its current step), and once
Celery has stopped consuming, it hands its in-flight work back through the path a model switch uses
(`Runner.hand_back`): sequences may finish for `shutdown_drain_seconds`, their results are recorded, the
rest go back to `queued` with their generated tokens checkpointed and their attempt not counted, and one
`batch.run` wake-up tells the model's other workers to claim them now.

Spot notices: the whole stop must fit in `shutdown_grace_seconds` from the SIGTERM (the pod's
terminationGracePeriodSeconds, a cloud's reclaim notice), so the drain is what is left of the grace, counted
from the signal, after SHUTDOWN_MARGIN_SECONDS for the checkpoint write and the exit
(`Settings.shutdown_drain_budget`); a drain cut short loses nothing, the rest resumes from its checkpoint.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from celery import signals

from storage.settings import Settings
from storage.wakeups import get_waker
from worker.feed.feeder import Feeder
from worker.process import readiness

log = logging.getLogger(__name__)

stopping = threading.Event()  # set on SIGTERM; the `batch.run` task's feeding loop watches it


def install(feeder: Feeder | None, *, settings: Settings) -> None:
    """Hook Celery's worker signals: ready once consuming; on SIGTERM stop and turn unready; at exit hand back."""
    signalled: list[float] = []  # when SIGTERM came: the grace runs from there

    def on_ready(**_: Any) -> None:
        readiness.mark_ready()

    def on_stop(**_: Any) -> None:  # runs in the signal handler: set flags only
        signalled.append(time.monotonic())
        readiness.mark_not_ready()
        stopping.set()

    def on_exit(**_: Any) -> None:  # after the consumer stopped: no task runs, the feeder is free
        if feeder is not None:
            elapsed = time.monotonic() - signalled[0] if signalled else 0.0
            hand_back(feeder, drain_seconds=settings.shutdown_drain_budget(elapsed=elapsed))

    signals.worker_ready.connect(on_ready, weak=False)
    signals.worker_shutting_down.connect(on_stop, weak=False)
    signals.worker_shutdown.connect(on_exit, weak=False)


def hand_back(feeder: Feeder, *, drain_seconds: float) -> int:
    """Let in-flight work finish for `drain_seconds`, re-queue the rest unrun and wake the model's other workers."""
    model = feeder.model
    try:
        released = feeder.hand_back(drain_seconds=drain_seconds)
    except Exception:  # the database is gone too: the leases expire and the reaper re-queues the rows
        log.exception("shutdown: handing in-flight work back failed; it returns when its leases expire")
        return 0
    log.info("shutdown: %d in-flight requests handed back to the queue", released)
    if released and model is not None:
        try:
            get_waker().send("batch.run", {"model": model})
        except Exception:  # a lost wake-up only delays the work: beat's reaper wakes the model
            log.warning("shutdown: could not wake %s's other workers", model, exc_info=True)
    return released
