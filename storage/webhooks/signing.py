"""Standard Webhooks signatures: `v1,` + base64 HMAC-SHA256 of "id.timestamp.body" under a `whsec_` secret."""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets

SECRET_PREFIX = "whsec_"
SECRET_BYTES = 32


def new_secret() -> str:
    """A fresh signing secret: `whsec_` + base64 of 32 random bytes (the form the openai SDK decodes)."""
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(SECRET_BYTES)).decode()


def secret_hint(secret: str) -> str:
    """A masked form safe to show after creation: the prefix and the last four characters."""
    return f"{SECRET_PREFIX}…{secret[-4:]}"


def sign(secret: str, *, message_id: str, timestamp: int, body: bytes) -> str:
    """One signature, `v1,<base64>`, over `{message_id}.{timestamp}.{body}`."""
    key = base64.b64decode(secret.removeprefix(SECRET_PREFIX))
    signed = f"{message_id}.{timestamp}.".encode() + body
    return "v1," + base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()


def signature_headers(secrets_: list[str], *, message_id: str, timestamp: int, body: bytes) -> dict[str, str]:
    """The three Standard Webhooks headers; several secrets (a rotation in progress) give space-separated signatures."""
    signatures = " ".join(sign(secret, message_id=message_id, timestamp=timestamp, body=body) for secret in secrets_)
    return {"webhook-id": message_id, "webhook-timestamp": str(timestamp), "webhook-signature": signatures}
