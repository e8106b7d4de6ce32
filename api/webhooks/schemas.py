"""Webhook endpoint and delivery shapes; endpoints as the openai SDK's `types/webhooks/` name them."""

from __future__ import annotations

from typing import Any, Literal

import orjson
from pydantic import BaseModel, Field

from storage.models import WebhookAttempt, WebhookEndpoint
from storage.webhooks.deliveries import DeliveryView
from storage.webhooks.signing import secret_hint
from storage.webhooks.targets import URL_MAX_CHARS


class WebhookEndpointCreate(BaseModel):
    url: str = Field(max_length=URL_MAX_CHARS, description="The HTTPS URL that receives deliveries.")
    name: str | None = Field(default=None, max_length=200, description="Default: the URL's host.")
    event_types: list[str] | None = Field(default=None, max_length=16, description="Default: every batch event.")


class WebhookEndpointUpdate(BaseModel):
    url: str | None = Field(default=None, max_length=URL_MAX_CHARS)
    name: str | None = Field(default=None, max_length=200)
    event_types: list[str] | None = Field(default=None, max_length=16)


class WebhookRotateSecret(BaseModel):
    keep_old_secret_active_for_24_hours: bool = False


class WebhookEndpointObject(BaseModel):
    id: str
    object: Literal["webhook_endpoint"] = "webhook_endpoint"
    created_at: int
    updated_at: int
    name: str
    url: str
    event_types: list[str]
    signing_secret_hint: str

    @classmethod
    def of(cls, row: WebhookEndpoint) -> WebhookEndpointObject:
        return cls(
            id=row.id,
            created_at=row.created_at,
            updated_at=row.updated_at,
            name=row.name,
            url=row.url,
            event_types=list(row.event_types),
            signing_secret_hint=secret_hint(row.secret),
        )


class WebhookEndpointWithSecret(WebhookEndpointObject):
    signing_secret: str = Field(description="`whsec_…`: returned only on create and on rotation.")

    @classmethod
    def of(cls, row: WebhookEndpoint) -> WebhookEndpointWithSecret:
        return cls(**WebhookEndpointObject.of(row).model_dump(), signing_secret=row.secret)


class WebhookEndpointList(BaseModel):
    object: Literal["list"] = "list"
    data: list[WebhookEndpointObject]
    first_id: str | None = None
    last_id: str | None = None
    has_more: bool = False


class WebhookEndpointDeleted(BaseModel):
    id: str
    object: Literal["webhook_endpoint.deleted"] = "webhook_endpoint.deleted"
    deleted: bool = True


class WebhookEventTypeList(BaseModel):
    object: Literal["list"] = "list"
    data: list[str]


class WebhookAttemptObject(BaseModel):
    number: int
    attempted_at: float
    duration_ms: int
    status_code: int | None = None
    error: str | None = None
    response_body: str | None = Field(default=None, description="A bounded prefix of what the receiver answered.")

    @classmethod
    def of(cls, row: WebhookAttempt) -> WebhookAttemptObject:
        return cls(
            number=row.number,
            attempted_at=row.attempted_at,
            duration_ms=row.duration_ms,
            status_code=row.status_code,
            error=row.error,
            response_body=row.response_body,
        )


class WebhookDeliveryObject(BaseModel):
    id: str = Field(description="The `webhook-id` header, the same on every attempt.")
    object: Literal["webhook_delivery"] = "webhook_delivery"
    webhook_endpoint_id: str
    event: dict[str, Any]
    status: Literal["pending", "delivered", "failed"]
    created_at: int
    delivered_at: int | None = None
    next_attempt_at: float | None = None
    attempt_count: int
    attempts: list[WebhookAttemptObject]

    @classmethod
    def of(cls, view: DeliveryView) -> WebhookDeliveryObject:
        row = view.delivery
        return cls(
            id=row.id,
            webhook_endpoint_id=row.endpoint_id,
            event=orjson.loads(view.event_body),
            status=row.status,
            created_at=row.created_at,
            delivered_at=row.delivered_at,
            next_attempt_at=row.next_attempt_at,
            attempt_count=row.attempts,
            attempts=[WebhookAttemptObject.of(attempt) for attempt in view.attempts],
        )


class WebhookDeliveryList(BaseModel):
    object: Literal["list"] = "list"
    data: list[WebhookDeliveryObject]
    first_id: str | None = None
    last_id: str | None = None
    has_more: bool = False
