"""Webhook endpoints: a tenant's receivers, every read scoped to the tenant."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from storage.clock import now
from storage.errors import InvalidRequest, WebhookEndpointNotFound
from storage.ids import new_id
from storage.models import WebhookEndpoint
from storage.paging import keyset_page
from storage.webhooks.signing import new_secret
from storage.webhooks.targets import TargetPolicy, resolve_target

# What Backfill emits (OpenAI's batch events; every protocol's batches send the same ones).
EVENT_TYPES = ("batch.completed", "batch.failed", "batch.expired", "batch.cancelled")
NAME_MAX_CHARS = 200
KEEP_OLD_SECRET_SECONDS = 24 * 3600


def check_event_types(event_types: Sequence[str] | None) -> list[str]:
    """The subscribed types, de-duplicated in EVENT_TYPES order; all of them when None."""
    if event_types is None:
        return list(EVENT_TYPES)
    unknown = sorted(set(event_types) - set(EVENT_TYPES))
    if unknown:
        raise InvalidRequest(
            f"Unsupported event types {unknown}: this server sends {', '.join(EVENT_TYPES)}.", param="event_types"
        )
    if not event_types:
        raise InvalidRequest("Subscribe to at least one event type.", param="event_types")
    return [kind for kind in EVENT_TYPES if kind in event_types]


def _check_name(name: str) -> str:
    name = name.strip()
    if not name or len(name) > NAME_MAX_CHARS:
        raise InvalidRequest(f"The name must be 1 to {NAME_MAX_CHARS} characters.", param="name")
    return name


def create_endpoint(
    session: Session,
    *,
    tenant_id: str,
    url: str,
    name: str | None,
    event_types: Sequence[str] | None,
    policy: TargetPolicy,
    max_per_tenant: int,
) -> WebhookEndpoint:
    """Register an endpoint after checking its URL and the tenant's endpoint count."""
    target = resolve_target(url, policy)
    kinds = check_event_types(event_types)
    count = session.scalar(select(func.count()).where(WebhookEndpoint.tenant_id == tenant_id)) or 0
    if count >= max_per_tenant:
        raise InvalidRequest(
            f"A tenant may register at most {max_per_tenant} webhook endpoints; delete one first.",
            param="url",
            code="too_many_webhook_endpoints",
        )
    created = now()
    endpoint = WebhookEndpoint(
        id=new_id("whep_"),
        tenant_id=tenant_id,
        name=_check_name(name if name is not None else target.hostname[:NAME_MAX_CHARS]),
        url=url,
        event_types=kinds,
        secret=new_secret(),
        created_at=created,
        updated_at=created,
    )
    session.add(endpoint)
    session.flush()
    return endpoint


def get_endpoint(session: Session, *, tenant_id: str, endpoint_id: str, lock: bool = False) -> WebhookEndpoint:
    """The tenant's endpoint, or WebhookEndpointNotFound (also for another tenant's)."""
    query = select(WebhookEndpoint).where(WebhookEndpoint.id == endpoint_id, WebhookEndpoint.tenant_id == tenant_id)
    endpoint = session.scalar(query.with_for_update() if lock else query)
    if endpoint is None:
        message = f"No webhook endpoint found with id '{endpoint_id}'."
        raise WebhookEndpointNotFound(message, param="webhook_endpoint_id")
    return endpoint


def list_endpoints(session: Session, *, tenant_id: str, after: str | None, limit: int) -> list[WebhookEndpoint]:
    """The tenant's endpoints newest first (ids are time-ordered), `limit + 1` rows to tell if more exist."""
    query = select(WebhookEndpoint).where(WebhookEndpoint.tenant_id == tenant_id)
    anchor = (after,) if after else None
    return keyset_page(session, query, key=(WebhookEndpoint.id,), anchor=anchor, limit=limit)


def update_endpoint(
    session: Session,
    *,
    tenant_id: str,
    endpoint_id: str,
    url: str | None,
    name: str | None,
    event_types: Sequence[str] | None,
    policy: TargetPolicy,
) -> WebhookEndpoint:
    """Change an endpoint's URL (checked again), name or event types."""
    endpoint = get_endpoint(session, tenant_id=tenant_id, endpoint_id=endpoint_id, lock=True)
    changed = False
    if url is not None and url != endpoint.url:
        resolve_target(url, policy)
        endpoint.url, changed = url, True
    if name is not None and _check_name(name) != endpoint.name:
        endpoint.name, changed = _check_name(name), True
    if event_types is not None and check_event_types(event_types) != endpoint.event_types:
        endpoint.event_types, changed = check_event_types(event_types), True
    if changed:
        endpoint.updated_at = now()
    session.flush()
    return endpoint


def rotate_secret(session: Session, *, tenant_id: str, endpoint_id: str, keep_old: bool) -> WebhookEndpoint:
    """A new signing secret; with `keep_old`, deliveries are signed with both for 24 hours."""
    endpoint = get_endpoint(session, tenant_id=tenant_id, endpoint_id=endpoint_id, lock=True)
    at = now()
    endpoint.previous_secret = endpoint.secret if keep_old else None
    endpoint.previous_secret_expires_at = at + KEEP_OLD_SECRET_SECONDS if keep_old else None
    endpoint.secret = new_secret()
    endpoint.updated_at = at
    session.flush()
    return endpoint


def delete_endpoint(session: Session, *, tenant_id: str, endpoint_id: str) -> str:
    """Delete the endpoint; its pending deliveries go with it (nothing more is sent there)."""
    endpoint = get_endpoint(session, tenant_id=tenant_id, endpoint_id=endpoint_id, lock=True)
    session.delete(endpoint)
    session.flush()
    return endpoint_id


def signing_secrets(endpoint: WebhookEndpoint, *, at: int) -> list[str]:
    """The secrets a delivery is signed with now: the current one, and a kept previous one until it expires."""
    kept = endpoint.previous_secret
    if kept and endpoint.previous_secret_expires_at is not None and endpoint.previous_secret_expires_at > at:
        return [endpoint.secret, kept]
    return [endpoint.secret]
