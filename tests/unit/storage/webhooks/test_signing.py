"""Signatures that the official openai SDK and the Standard Webhooks reference library both accept."""

from __future__ import annotations

import base64
import time

import openai
import pytest
import standardwebhooks

from storage.webhooks.events import event_body
from storage.webhooks.signing import new_secret, secret_hint, signature_headers


def signed(secrets: list[str], body: str, *, message_id: str = "msg_1", timestamp: int | None = None) -> dict[str, str]:
    stamp = int(time.time()) if timestamp is None else timestamp
    return signature_headers(secrets, message_id=message_id, timestamp=stamp, body=body.encode())


def test_a_new_secret_is_whsec_and_32_random_bytes() -> None:
    first, second = new_secret(), new_secret()
    assert first.startswith("whsec_") and first != second
    assert len(base64.b64decode(first.removeprefix("whsec_"))) == 32
    assert secret_hint(first) == f"whsec_…{first[-4:]}" and first[6:-4] not in secret_hint(first)


def test_the_openai_sdk_unwraps_a_signed_batch_event() -> None:
    secret = new_secret()
    body = event_body(event_id="evt_1", type_="batch.completed", created_at=1_700_000_000, subject_id="batch_abc")
    event = openai.OpenAI(api_key="unused").webhooks.unwrap(body, signed([secret], body), secret=secret)
    assert event.type == "batch.completed" and event.data.id == "batch_abc"
    assert event.id == "evt_1" and event.object == "event" and event.created_at == 1_700_000_000


def test_the_standard_webhooks_library_verifies_the_same_headers() -> None:
    secret = new_secret()
    body = event_body(event_id="evt_2", type_="batch.failed", created_at=1, subject_id="batch_x")
    assert standardwebhooks.Webhook(secret).verify(body, signed([secret], body))["data"] == {"id": "batch_x"}


def test_a_wrong_secret_a_changed_body_or_an_old_timestamp_is_rejected() -> None:
    secret, other = new_secret(), new_secret()
    body = event_body(event_id="evt_3", type_="batch.expired", created_at=1, subject_id="batch_y")
    webhooks = openai.OpenAI(api_key="unused").webhooks
    with pytest.raises(openai.InvalidWebhookSignatureError):
        webhooks.verify_signature(body, signed([secret], body), secret=other)
    with pytest.raises(openai.InvalidWebhookSignatureError):
        webhooks.verify_signature(body.replace("batch_y", "batch_z"), signed([secret], body), secret=secret)
    with pytest.raises(openai.InvalidWebhookSignatureError):
        webhooks.verify_signature(body, signed([secret], body, timestamp=int(time.time()) - 3600), secret=secret)


def test_during_a_rotation_either_secret_verifies() -> None:
    new, old = new_secret(), new_secret()
    body = event_body(event_id="evt_4", type_="batch.cancelled", created_at=1, subject_id="batch_z")
    headers = signed([new, old], body)
    assert len(headers["webhook-signature"].split(" ")) == 2
    for secret in (new, old):
        openai.OpenAI(api_key="unused").webhooks.verify_signature(body, headers, secret=secret)
        standardwebhooks.Webhook(secret).verify(body, headers)
