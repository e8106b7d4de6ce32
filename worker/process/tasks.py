"""Thin Celery tasks named noun.verb: parse, call one service function, log."""

from __future__ import annotations

import logging

from storage.settings import get_settings
from worker.jobs import webhooks
from worker.process import service, shutdown
from worker.process.celery_app import app

log = logging.getLogger(__name__)


@app.task(name="batch.ingest")
def batch_ingest(batch_id: str) -> str:
    """Validate a new batch's file and fill the queue."""
    return service.ingest(batch_id)


@app.task(name="batch.run")
def batch_run(model: str) -> bool:
    """Feed the warm engine for up to run_task_seconds (well inside the visibility timeout), then re-wake."""
    feeder = service.get_feeder()
    if model not in feeder.models:
        log.warning("worker serves %s, got a wake-up for %s", ", ".join(feeder.models), model)
        return False
    # Any served model's wake-up runs the feeder: a slot decides which model to serve (and may switch).
    service.run_task_started()
    more = False
    try:
        more = feeder.serve_for(float(get_settings().run_task_seconds), stop=shutdown.stopping)
    finally:  # with work left the same worker goes on (its own queue); stopping: the hand-back wakes others
        service.run_task_ended(model=feeder.model, more=more and not shutdown.stopping.is_set())
    return more


@app.task(name="batch.finalize")
def batch_finalize(batch_id: str) -> str | None:
    """Write a finished batch's output and error files."""
    return service.finalize(batch_id)


@app.task(name="lease.reap")
def lease_reap() -> int:
    """Release expired leases, expire overdue batches, wake whoever has work."""
    return service.reap_once().requeued


@app.task(name="webhook.deliver")
def webhook_deliver() -> int:
    """Send the webhook deliveries that are due (new events and retries)."""
    return webhooks.deliver_due()
