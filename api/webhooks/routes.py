"""Webhook endpoints (a Backfill extension at /v1/webhooks, also at the openai SDK's /v1/webhook_endpoints)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from api.deps import Caller, Config, Cursor, DbSession
from api.paging import cursor_fields
from api.webhooks.schemas import (
    WebhookDeliveryList,
    WebhookDeliveryObject,
    WebhookEndpointCreate,
    WebhookEndpointDeleted,
    WebhookEndpointList,
    WebhookEndpointObject,
    WebhookEndpointUpdate,
    WebhookEndpointWithSecret,
    WebhookEventTypeList,
    WebhookRotateSecret,
)
from storage.webhooks.deliveries import list_deliveries
from storage.webhooks.endpoints import (
    EVENT_TYPES,
    create_endpoint,
    delete_endpoint,
    get_endpoint,
    list_endpoints,
    rotate_secret,
    update_endpoint,
)
from storage.webhooks.targets import TargetPolicy

# Mounted twice by the app: /v1/webhooks and /v1/webhook_endpoints (what `client.webhooks.*` calls).
router = APIRouter(tags=["webhooks"])
event_types_router = APIRouter(prefix="/v1/webhook_event_types", tags=["webhooks"])

Limit = Annotated[int, Query(ge=1, le=100)]


@router.post("", response_model=WebhookEndpointWithSecret)
def create(
    body: WebhookEndpointCreate, session: DbSession, caller: Caller, settings: Config
) -> WebhookEndpointWithSecret:
    """Register an endpoint. Its `signing_secret` (`whsec_…`) is returned now and never again."""
    endpoint = create_endpoint(
        session,
        tenant_id=caller.tenant_id,
        url=body.url,
        name=body.name,
        event_types=body.event_types,
        policy=TargetPolicy.from_settings(settings),
        max_per_tenant=settings.webhook_endpoints_per_tenant_max,
    )
    return WebhookEndpointWithSecret.of(endpoint)


@router.get("", response_model=WebhookEndpointList)
def list_all(session: DbSession, caller: Caller, after: Cursor = None, limit: Limit = 20) -> WebhookEndpointList:
    """The caller's endpoints, newest first."""
    rows = list_endpoints(session, tenant_id=caller.tenant_id, after=after, limit=limit)
    page = [WebhookEndpointObject.of(row) for row in rows[:limit]]
    return WebhookEndpointList(
        data=page,
        **cursor_fields(page, has_more=len(rows) > limit),
    )


@router.get("/{webhook_endpoint_id}", response_model=WebhookEndpointObject)
def retrieve(webhook_endpoint_id: str, session: DbSession, caller: Caller) -> WebhookEndpointObject:
    """One endpoint (without its secret)."""
    return WebhookEndpointObject.of(get_endpoint(session, tenant_id=caller.tenant_id, endpoint_id=webhook_endpoint_id))


@router.post("/{webhook_endpoint_id}", response_model=WebhookEndpointObject)
def update(
    webhook_endpoint_id: str, body: WebhookEndpointUpdate, session: DbSession, caller: Caller, settings: Config
) -> WebhookEndpointObject:
    """Change an endpoint's URL, name or event types; a new URL is checked like a new endpoint's."""
    endpoint = update_endpoint(
        session,
        tenant_id=caller.tenant_id,
        endpoint_id=webhook_endpoint_id,
        url=body.url,
        name=body.name,
        event_types=body.event_types,
        policy=TargetPolicy.from_settings(settings),
    )
    return WebhookEndpointObject.of(endpoint)


@router.delete("/{webhook_endpoint_id}", response_model=WebhookEndpointDeleted)
def delete(webhook_endpoint_id: str, session: DbSession, caller: Caller) -> WebhookEndpointDeleted:
    """Delete an endpoint; its pending deliveries are dropped."""
    return WebhookEndpointDeleted(
        id=delete_endpoint(session, tenant_id=caller.tenant_id, endpoint_id=webhook_endpoint_id)
    )


@router.post("/{webhook_endpoint_id}/rotate_secret", response_model=WebhookEndpointWithSecret)
def rotate(
    webhook_endpoint_id: str, session: DbSession, caller: Caller, body: WebhookRotateSecret | None = None
) -> WebhookEndpointWithSecret:
    """A new signing secret, returned once; optionally the old one keeps signing too for 24 hours."""
    keep = body.keep_old_secret_active_for_24_hours if body is not None else False
    endpoint = rotate_secret(session, tenant_id=caller.tenant_id, endpoint_id=webhook_endpoint_id, keep_old=keep)
    return WebhookEndpointWithSecret.of(endpoint)


@router.get("/{webhook_endpoint_id}/deliveries", response_model=WebhookDeliveryList)
def deliveries(
    webhook_endpoint_id: str, session: DbSession, caller: Caller, after: Cursor = None, limit: Limit = 20
) -> WebhookDeliveryList:
    """The endpoint's deliveries newest first, each with its event and every attempt (status, error, answer prefix)."""
    views = list_deliveries(
        session, tenant_id=caller.tenant_id, endpoint_id=webhook_endpoint_id, after=after, limit=limit
    )
    page = [WebhookDeliveryObject.of(view) for view in views[:limit]]
    return WebhookDeliveryList(
        data=page,
        **cursor_fields(page, has_more=len(views) > limit),
    )


@event_types_router.get("", response_model=WebhookEventTypeList)
def event_types(caller: Caller) -> WebhookEventTypeList:
    """The event types this server sends."""
    return WebhookEventTypeList(data=list(EVENT_TYPES))
