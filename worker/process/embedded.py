"""The embedded default: the same worker operations, run by one thread inside `backfill serve`."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from storage.db import transaction
from storage.queue.backlog import batches_ready_to_finalize
from storage.wakeups import EventWaker, set_waker
from worker.jobs import webhooks
from worker.process import service

log = logging.getLogger(__name__)


class EmbeddedWorker:
    """Ingest, run, finalize and reap in a loop; a wake-up event cuts the idle wait short."""

    def __init__(self, *, reap_interval_seconds: float = 5.0) -> None:
        self.waker = EventWaker()
        set_waker(self.waker)
        self.stop = threading.Event()
        self.ready = threading.Event()
        self.reap_interval_seconds = reap_interval_seconds
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._main, name="backfill-worker", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def shutdown(self, timeout: float = 30.0) -> None:
        self.stop.set()
        self.waker.interrupt.set()  # the engine's time slice ends
        self.waker.event.set()
        self.thread.join(timeout)
        if self.ready.is_set():
            service.shut_down()

    def _main(self) -> None:
        try:
            # BACKFILL_WORKER_MODELS with several names: those share one engine slot, loaded one at a time;
            # any other registry model keeps its own engine, as by default.
            feeders = service.embedded_feeders()
            for feeder in feeders:
                feeder.warm()
            service.start_liveness()  # a restart takes its predecessor's leases back at once
        except BaseException as error:  # surfaced on /health
            self.error = error
            log.exception("embedded worker could not load its engine")
            return
        self.ready.set()
        last_reap = 0.0
        while not self.stop.is_set():
            self.waker.event.clear()
            busy = False
            try:
                if time.monotonic() - last_reap >= self.reap_interval_seconds:
                    last_reap = time.monotonic()
                    service.reap_once()
                if not self.stop.is_set():
                    self.waker.interrupt.clear()  # a batch created from here on ends the slice below early
                busy |= self._ingest_pending()
                for feeder in feeders:
                    busy |= feeder.serve_for(1.0, stop=self.waker.interrupt)
                busy |= self._finalize_ready()
                webhooks.deliver_in_background(stop=self.stop)
            except Exception:
                log.exception("embedded worker pass failed; retrying")
                time.sleep(1.0)
            if not busy:
                self.waker.event.wait(0.5)

    def _ingest_pending(self) -> bool:
        with transaction() as session:
            ids = service.pending_ingest(session)
        for batch_id in ids:
            _isolated(service.ingest, batch_id)
        return bool(ids)

    def _finalize_ready(self) -> bool:
        with transaction() as session:
            ids = batches_ready_to_finalize(session)
        for batch_id in ids:
            _isolated(service.finalize, batch_id)
        return bool(ids)


def _isolated(operation: Callable[[str], object], batch_id: str) -> None:
    """One batch's failure is logged and left for the next pass; the other batches still get theirs."""
    try:
        operation(batch_id)
    except Exception:
        log.exception("embedded worker: %s of batch %s failed", operation.__name__, batch_id)
