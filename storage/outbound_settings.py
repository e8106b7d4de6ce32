"""The settings of Backfill's outbound network traffic, webhooks and media fetches (both bounded the same way:
which networks a target may resolve to, how long an attempt may take). `Settings` (storage/settings.py) inherits
them; read them through `get_settings()` like every other BACKFILL_ variable."""

from __future__ import annotations

import json
from typing import Annotated, Any

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict


class OutboundSettings(BaseSettings):
    """Webhook deliveries and the fetches of batch lines' images and documents."""

    model_config = SettingsConfigDict(env_prefix="BACKFILL_", extra="ignore")

    # Webhooks (docs/webhooks.md): signed, retried with exponential backoff and jitter for up to the window.
    webhook_allow_http: bool = False  # plain http:// targets (tests, a receiver on the same trusted host)
    # Non-public networks a target may resolve to (JSON list or comma-separated CIDRs, e.g. "127.0.0.1/32").
    # Empty: loopback, private, CGNAT and reserved addresses are refused. Link-local and cloud metadata always are.
    webhook_allowed_networks: Annotated[list[str], NoDecode] = Field(default_factory=list)
    # The whole attempt (connect, send, read the answer) ends this long after it began, however the receiver
    # paces its bytes.
    webhook_timeout_seconds: float = Field(default=10.0, gt=0, le=60)
    webhook_retry_base_seconds: float = Field(default=5.0, gt=0)  # first retry after about this long
    webhook_retry_max_interval_seconds: float = Field(default=6 * 3600.0, gt=0)  # the doubling stops here
    webhook_retry_window_seconds: int = Field(default=72 * 3600, ge=1)  # give up this long after the event
    webhook_endpoints_per_tenant_max: int = Field(default=20, ge=1, le=1000)
    webhook_response_prefix_bytes: int = Field(default=1024, ge=0, le=65536)  # of each answer, kept per attempt
    webhook_concurrency: int = Field(default=8, ge=1, le=64)  # deliveries sent at once by one deliverer
    # Of those, at most this many to one tenant's endpoints: its excess waits in the table, so a tenant whose
    # receivers hang never takes the slots other tenants' deliveries need. At most `webhook_concurrency`.
    webhook_concurrency_per_tenant: int = Field(default=2, ge=1, le=64)
    webhook_poll_seconds: float = Field(default=5.0, gt=0)  # how often due retries are looked for
    # Images and documents of batch lines (docs/images.md, worker/engine/media.py). Remote URLs are fetched by the
    # worker under the webhooks' network rules: public addresses only unless `media_allowed_networks` opens a
    # network (link-local and cloud metadata never); plain http unless `media_allow_http` is off. Each image or
    # document (fetched or inline) holds at most `media_max_bytes`, each fetch ends `media_fetch_timeout_seconds`
    # after it began however its server paces its bytes, `media_fetch_concurrency` run at once. An image's decoded
    # pixels are checked before it is decoded (decompression bombs) and it is scaled to fit a square of
    # `media_image_max_side_px` (512 px for `detail: low`); a line holds at most `media_max_items` of them. A PDF's
    # text is extracted in a child process with at most `document_max_pages` pages, within
    # `document_timeout_seconds`.
    media_max_bytes: int = Field(default=20 * 1024 * 1024, ge=1024)
    media_fetch_timeout_seconds: float = Field(default=10.0, gt=0, le=300)
    media_fetch_concurrency: int = Field(default=64, ge=1, le=4096)
    media_allow_http: bool = True
    media_allowed_networks: Annotated[list[str], NoDecode] = Field(default_factory=list)
    media_image_max_pixels: int = Field(default=8000 * 8000, ge=1)
    media_image_max_side_px: int = Field(default=2048, ge=16, le=16384)
    media_max_items: int = Field(default=100, ge=1, le=10_000)
    document_max_pages: int = Field(default=100, ge=1, le=100_000)
    document_timeout_seconds: float = Field(default=30.0, gt=0, le=3600)

    @field_validator("webhook_allowed_networks", "media_allowed_networks", mode="before")
    @classmethod
    def _parse_networks(cls, value: Any) -> Any:
        if isinstance(value, str):
            text = value.strip()
            if text.startswith("["):
                return json.loads(text)
            return [part.strip() for part in text.split(",") if part.strip()]
        return value

    @field_validator("webhook_allowed_networks", "media_allowed_networks")
    @classmethod
    def _networks_valid(cls, value: list[str]) -> list[str]:
        import ipaddress

        for network in value:
            try:
                ipaddress.ip_network(network, strict=False)
            except ValueError:
                raise ValueError(f"{network!r} is not a network like 127.0.0.1/32 or 10.0.0.0/8") from None
        return value
