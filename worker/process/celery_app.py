"""The Celery app: Redis wakes workers; Postgres stays the queue of record."""

from __future__ import annotations

from celery import Celery

from storage.settings import get_settings


def make_celery() -> Celery:
    """Celery configured for idempotent, late-acknowledged, one-at-a-time GPU tasks."""
    settings = get_settings()
    broker = settings.redis_url or "memory://"
    app = Celery("backfill", broker=broker, include=["worker.process.tasks"])
    app.conf.update(
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        task_default_queue="default",
        broker_transport_options={"visibility_timeout": settings.broker_visibility_timeout_seconds},
        broker_connection_retry_on_startup=True,
        task_ignore_result=True,
        beat_schedule={
            "lease.reap": {"task": "lease.reap", "schedule": float(settings.reap_interval_seconds)},
            "webhook.deliver": {"task": "webhook.deliver", "schedule": float(settings.webhook_poll_seconds)},
        },
        worker_hijack_root_logger=False,
    )
    return app


app = make_celery()
