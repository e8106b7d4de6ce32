"""Deliveries: claim the due ones for sending, record each attempt, list them for their tenant."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session

from storage.clock import now
from storage.models import WebhookAttempt, WebhookDelivery, WebhookEndpoint, WebhookEvent
from storage.paging import keyset
from storage.webhooks.endpoints import get_endpoint, signing_secrets
from storage.webhooks.events import DELIVERED, FAILED, PENDING

ERROR_MAX_CHARS = 500


@dataclass(frozen=True)
class DueDelivery:
    """What a sender needs for one attempt; `id` is the `webhook-id` header."""

    id: str
    url: str
    secrets: tuple[str, ...]
    body: str
    attempts: int  # attempts made before this one
    created_at: int  # the event's time: retries stop a window after it
    tenant_id: str = ""  # whose delivery it is: a deliverer gives each tenant a bounded share of its slots


@dataclass(frozen=True)
class Outcome:
    """How one attempt went: `status_code` None means no HTTP answer (refused target, timeout, connection)."""

    attempted_at: float
    duration_ms: int
    status_code: int | None
    error: str | None
    response_body: str | None

    @property
    def delivered(self) -> bool:
        return self.status_code is not None and 200 <= self.status_code < 300


def claim_due(
    session: Session,
    *,
    at: float,
    limit: int,
    claim_seconds: float,
    per_tenant: int | None = None,
    in_flight: Mapping[str, int] | None = None,
) -> list[DueDelivery]:
    """Lock up to `limit` due deliveries and push their due time `claim_seconds` out while they are sent.

    With `per_tenant`, no tenant gets more than that many counting its `in_flight` ones (tenant id -> count):
    its other due rows stay in the table for a later claim, oldest first, so they never wait in a queue
    ahead of other tenants' deliveries. A sender that dies mid-attempt leaves the row due again when the
    claim runs out: at least once.
    """
    load = Counter(in_flight or {})
    cap = per_tenant or limit
    claimed: list[DueDelivery] = []
    while len(claimed) < limit:
        full = [tenant for tenant, count in load.items() if count >= cap]
        rows = session.execute(
            select(WebhookDelivery, WebhookEndpoint, WebhookEvent.body)
            .join(WebhookEndpoint, WebhookEndpoint.id == WebhookDelivery.endpoint_id)
            .join(WebhookEvent, WebhookEvent.id == WebhookDelivery.event_id)
            .where(WebhookDelivery.status == PENDING, WebhookDelivery.next_attempt_at <= at)
            .where(WebhookDelivery.tenant_id.not_in(full), WebhookDelivery.id.not_in([c.id for c in claimed]))
            .order_by(WebhookDelivery.next_attempt_at)
            .limit(limit - len(claimed))
            .with_for_update(skip_locked=True, of=WebhookDelivery)
        ).all()
        if not rows:
            break
        for delivery, endpoint, body in rows:  # the first row's tenant is never full: each round claims one
            if load[delivery.tenant_id] >= cap:
                continue
            load[delivery.tenant_id] += 1
            delivery.next_attempt_at = at + claim_seconds
            secrets = tuple(signing_secrets(endpoint, at=int(at)))
            claimed.append(
                DueDelivery(
                    delivery.id, endpoint.url, secrets, body, delivery.attempts, delivery.created_at, delivery.tenant_id
                )
            )
    session.flush()
    return claimed


def record_attempt(session: Session, *, delivery_id: str, outcome: Outcome, retry_at: float | None) -> None:
    """Store the attempt; a 2xx ends the delivery, otherwise it is due again at `retry_at` (None: give up)."""
    delivery = session.get(WebhookDelivery, delivery_id, with_for_update=True)
    if delivery is None:  # its endpoint was deleted while the attempt was in flight
        return
    delivery.attempts += 1
    session.add(
        WebhookAttempt(
            delivery_id=delivery_id,
            number=delivery.attempts,
            attempted_at=outcome.attempted_at,
            duration_ms=outcome.duration_ms,
            status_code=outcome.status_code,
            error=None if outcome.error is None else outcome.error[:ERROR_MAX_CHARS],
            response_body=outcome.response_body,
        )
    )
    delivery.last_status_code = outcome.status_code
    if delivery.status != PENDING:  # a late report from an expired claim: keep the end state
        pass
    elif outcome.delivered:
        delivery.status, delivery.next_attempt_at, delivery.delivered_at = DELIVERED, None, now()
    elif retry_at is None:
        delivery.status, delivery.next_attempt_at = FAILED, None
    else:
        delivery.next_attempt_at = retry_at
    session.flush()


@dataclass(frozen=True)
class DeliveryView:
    """A delivery as its tenant reads it: the event it carries and every attempt so far."""

    delivery: WebhookDelivery
    event_body: str
    attempts: list[WebhookAttempt]


def list_deliveries(
    session: Session, *, tenant_id: str, endpoint_id: str, after: str | None, limit: int
) -> list[DeliveryView]:
    """The endpoint's deliveries newest first, `limit + 1` of them, each with its attempts in order."""
    get_endpoint(session, tenant_id=tenant_id, endpoint_id=endpoint_id)
    query = (
        select(WebhookDelivery, WebhookEvent.body)
        .join(WebhookEvent, WebhookEvent.id == WebhookDelivery.event_id)
        .where(WebhookDelivery.endpoint_id == endpoint_id, WebhookDelivery.tenant_id == tenant_id)
    )
    anchor = (after,) if after else None
    rows = session.execute(keyset(query, key=(WebhookDelivery.id,), anchor=anchor, limit=limit)).all()
    ids = [delivery.id for delivery, _ in rows]
    attempts: dict[str, list[WebhookAttempt]] = {delivery_id: [] for delivery_id in ids}
    if ids:
        found = session.scalars(
            select(WebhookAttempt)
            .where(WebhookAttempt.delivery_id.in_(ids))
            .order_by(WebhookAttempt.delivery_id, WebhookAttempt.number)
        )
        for attempt in found:
            attempts[attempt.delivery_id].append(attempt)
    return [DeliveryView(delivery, body, attempts[delivery.id]) for delivery, body in rows]
