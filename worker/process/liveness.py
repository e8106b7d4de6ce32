"""A GPU worker's liveness: its identity, its heartbeat row, and a thread that keeps its held work leased.

The thread beats every `heartbeat_seconds`: it stamps the worker's row, renews the leases of work its
runners hold between tasks (`Runner.renew_idle`), and, in a Celery deployment, wakes this worker itself
when it is idle while its models have queued work, so every live worker keeps its engine fed whoever got
the shared wake-up. A starting worker first takes over the leases of the worker it replaces; the reaper
releases those of a worker whose row went stale (docs/workers.md).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Sequence

from storage.db import transaction
from storage.queue.backlog import has_queued
from storage.queue.reaping import release_worker_leases
from storage.queue.workers import KnownWorker, WorkerIdentity, beat, forget_workers, workers_on_host
from storage.settings import Settings
from worker.feed.runner import Runner
from worker.jobs.reaper import MAX_ATTEMPTS

log = logging.getLogger(__name__)

RESEND_WAKE_SECONDS = 30.0  # a self-wake not picked up by then is sent again (a broker restart may lose it)


def make_identity(settings: Settings) -> WorkerIdentity:
    """This process's identity: unique per start (host, pid, random suffix), with the operator's slot."""
    host, pid = socket.gethostname(), os.getpid()
    return WorkerIdentity(f"{host}:{pid}:{uuid.uuid4().hex[:8]}", host, pid, settings.worker_slot)


def replaces(identity: WorkerIdentity, other: KnownWorker) -> bool:
    """True if `other` (a row on this host) is a predecessor this worker takes over from at start.

    The same explicit slot, a process that no longer exists, or our own pid (a container restarted in a
    fresh pid namespace): none of them can be a live worker.
    """
    if other.worker_id == identity.worker_id:
        return False
    if identity.slot is not None and other.slot == identity.slot:
        return True
    return other.pid == identity.pid or not process_alive(other.pid)


def process_alive(pid: int) -> bool:
    """Whether `pid` names a running (not zombie) process on this host."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as stat:
            return stat.read().rpartition(")")[2].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return True


def register(identity: WorkerIdentity, *, models: Sequence[str]) -> int:
    """Write this worker's row and release the leases of the workers it replaces; return how many."""
    with transaction() as session:
        gone = [w.worker_id for w in workers_on_host(session, host=identity.host) if replaces(identity, w)]
        released = release_worker_leases(session, worker_ids=gone, max_attempts=MAX_ATTEMPTS)
        forget_workers(session, worker_ids=gone)
        beat(session, identity=identity, models=models)
    if gone:
        log.info(
            "took over from %d previous worker(s) on %s: %d requests back in the queue",
            len(gone),
            identity.host,
            released,
        )
    return released


class SelfWake:
    """At most one outstanding `batch.run` wake-up to this worker's own queue."""

    def __init__(self, send: Callable[[], None]) -> None:
        self.send = send
        self.running = False
        self.sent_at: float | None = None
        self._lock = threading.Lock()

    def task_started(self) -> None:
        with self._lock:
            self.running, self.sent_at = True, None

    def task_ended(self, *, more: bool) -> None:
        with self._lock:
            self.running = False
        if more:
            self.wake()

    def due(self) -> bool:
        """Idle and no wake-up on its way (or the last one is overdue)."""
        with self._lock:
            pending = self.sent_at is not None and time.monotonic() - self.sent_at < RESEND_WAKE_SECONDS
            return not self.running and not pending

    def wake(self) -> None:
        self.send()  # raises if the broker is down: the next heartbeat tries again
        with self._lock:
            self.sent_at = time.monotonic()


class Heartbeat:
    """The thread that keeps a worker's row fresh and its held work leased while the process lives."""

    def __init__(
        self,
        identity: WorkerIdentity,
        settings: Settings,
        *,
        models: Sequence[str],
        runners: Callable[[], list[Runner]],
        self_wake: SelfWake | None = None,
    ) -> None:
        self.identity = identity
        self.settings = settings
        self.models = list(models)
        self.runners = runners
        self.self_wake = self_wake
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._main, name="backfill-heartbeat", daemon=True)

    def start(self) -> None:
        """Register (taking over from a predecessor), then beat in the background."""
        register(self.identity, models=self.models)
        self.thread.start()

    def shutdown(self, *, forget: bool = True) -> None:
        """Stop beating; drop the row so nobody waits for this worker to go stale."""
        self.stop.set()
        if self.thread.is_alive():
            self.thread.join(10)
        if forget:
            with transaction() as session:
                forget_workers(session, worker_ids=[self.identity.worker_id])

    def beat_once(self) -> None:
        """One beat: stamp the row, renew idle runners' leases, wake this worker if it idles beside work."""
        with transaction() as session:
            beat(session, identity=self.identity, models=self.models)
        for runner in self.runners():
            runner.renew_idle()
        if self.self_wake is not None and self.self_wake.due() and self._has_work():
            self.self_wake.wake()

    def _has_work(self) -> bool:
        with transaction() as session:
            return any(has_queued(session, model=model) for model in self.models)

    def _main(self) -> None:
        while not self.stop.wait(self.settings.heartbeat_seconds):
            try:
                self.beat_once()
            except Exception:  # the database or the broker is away: keep beating, the next one may land
                log.warning("heartbeat of %s failed; retrying", self.identity.worker_id, exc_info=True)
