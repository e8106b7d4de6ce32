"""The outbox: an event row and its deliveries, added in the transaction of the status change they report."""

from __future__ import annotations

import orjson
from sqlalchemy import select
from sqlalchemy.orm import Session

from storage.clock import now_f
from storage.ids import new_id
from storage.models import WebhookDelivery, WebhookEndpoint, WebhookEvent
from storage.wakeups import wake_after_commit

# A batch's end state -> the event OpenAI sends for it.
BATCH_EVENTS = {
    "completed": "batch.completed",
    "failed": "batch.failed",
    "expired": "batch.expired",
    "cancelled": "batch.cancelled",
}
PENDING = "pending"
DELIVERED = "delivered"
FAILED = "failed"


def event_body(*, event_id: str, type_: str, created_at: int, subject_id: str) -> str:
    """OpenAI's event payload, `{"object": "event", "id", "type", "created_at", "data": {"id"}}`, compact."""
    payload = {"object": "event", "id": event_id, "type": type_, "created_at": created_at, "data": {"id": subject_id}}
    return orjson.dumps(payload).decode()


def record_batch_event(session: Session, *, tenant_id: str, batch_id: str, status: str, at: int) -> WebhookEvent | None:
    """The event for a batch that just reached `status` (None for a status no event reports)."""
    type_ = BATCH_EVENTS.get(status)
    if type_ is None:
        return None
    return record_event(session, tenant_id=tenant_id, type_=type_, subject_id=batch_id, at=at)


def record_event(session: Session, *, tenant_id: str, type_: str, subject_id: str, at: int) -> WebhookEvent:
    """Add the event and one pending delivery per endpoint of the tenant subscribed to it; wake the deliverer."""
    event_id = new_id("evt_")
    event = WebhookEvent(
        id=event_id,
        tenant_id=tenant_id,
        type=type_,
        subject_id=subject_id,
        body=event_body(event_id=event_id, type_=type_, created_at=at, subject_id=subject_id),
        created_at=at,
    )
    session.add(event)
    endpoints = session.scalars(select(WebhookEndpoint).where(WebhookEndpoint.tenant_id == tenant_id)).all()
    due = now_f()
    subscribed = [endpoint for endpoint in endpoints if type_ in endpoint.event_types]
    for endpoint in subscribed:
        session.add(
            WebhookDelivery(
                id=new_id("msg_"),
                event_id=event_id,
                endpoint_id=endpoint.id,
                tenant_id=tenant_id,
                status=PENDING,
                attempts=0,
                next_attempt_at=due,
                created_at=at,
            )
        )
    if subscribed:
        wake_after_commit(session, "webhook.deliver")
    return event
