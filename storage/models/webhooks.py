"""Webhooks: endpoints, the event outbox, deliveries and their attempts."""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
)
from sqlalchemy.orm import Mapped, mapped_column

from storage.models.base import Base


class WebhookEndpoint(Base):
    """A tenant's registered receiver: where events go and the secret they are signed with."""

    __tablename__ = "webhook_endpoints"
    __table_args__ = (Index("ix_webhook_endpoints_tenant_created", "tenant_id", "created_at"),)

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    name: Mapped[str] = mapped_column(String(200))
    url: Mapped[str] = mapped_column(String(2048))
    event_types: Mapped[list[Any]] = mapped_column(JSON)
    # The signing key itself (HMAC needs it in clear), `whsec_` + base64; after a rotation that keeps the old
    # one active, deliveries carry a signature with each until `previous_secret_expires_at`.
    secret: Mapped[str] = mapped_column(String(128))
    previous_secret: Mapped[str | None] = mapped_column(String(128))
    previous_secret_expires_at: Mapped[int | None] = mapped_column(BigInteger)
    created_at: Mapped[int] = mapped_column(BigInteger)
    updated_at: Mapped[int] = mapped_column(BigInteger)


class WebhookEvent(Base):
    """The outbox: one row per event, written in the transaction of the status change it reports."""

    __tablename__ = "webhook_events"
    __table_args__ = (Index("ix_webhook_events_tenant_created", "tenant_id", "created_at"),)

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    type: Mapped[str] = mapped_column(String(64))
    subject_id: Mapped[str] = mapped_column(String(64))  # the batch the event is about
    body: Mapped[str] = mapped_column(Text)  # the exact JSON sent (and signed) on every attempt
    created_at: Mapped[int] = mapped_column(BigInteger)


class WebhookDelivery(Base):
    """One event for one endpoint: its `id` is the `webhook-id` header, the same on every retry."""

    __tablename__ = "webhook_deliveries"
    __table_args__ = (
        Index("ix_webhook_deliveries_due", "status", "next_attempt_at"),
        Index("ix_webhook_deliveries_endpoint_created", "endpoint_id", "created_at"),
    )

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    event_id: Mapped[str] = mapped_column(ForeignKey("webhook_events.id", ondelete="CASCADE"))
    endpoint_id: Mapped[str] = mapped_column(ForeignKey("webhook_endpoints.id", ondelete="CASCADE"))
    tenant_id: Mapped[str] = mapped_column(String(64))
    status: Mapped[str] = mapped_column(String(16))  # pending, delivered, failed
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    # When the next attempt is due; while an attempt is in flight, the end of its claim (a crashed sender's
    # delivery comes due again then). None once delivered or given up.
    next_attempt_at: Mapped[float | None] = mapped_column(Float)
    last_status_code: Mapped[int | None] = mapped_column(Integer)
    created_at: Mapped[int] = mapped_column(BigInteger)
    delivered_at: Mapped[int | None] = mapped_column(BigInteger)


class WebhookAttempt(Base):
    """One HTTP attempt of a delivery: what the receiver answered (a bounded prefix) or why it failed."""

    __tablename__ = "webhook_attempts"

    delivery_id: Mapped[str] = mapped_column(ForeignKey("webhook_deliveries.id", ondelete="CASCADE"), primary_key=True)
    number: Mapped[int] = mapped_column(Integer, primary_key=True)
    attempted_at: Mapped[float] = mapped_column(Float)
    duration_ms: Mapped[int] = mapped_column(Integer)
    status_code: Mapped[int | None] = mapped_column(Integer)
    error: Mapped[str | None] = mapped_column(String(500))
    response_body: Mapped[str | None] = mapped_column(Text)
