"""Webhook endpoints through the API: the openai SDK's `client.webhooks.*` and the /v1/webhooks extension."""

from __future__ import annotations

import httpx
import openai
import pytest
from openai.types.webhooks import DeletedWebhookEndpoint, WebhookEndpoint, WebhookEndpointWithSecret

from tests.conftest import LiveServer, make_key
from tests.integration.api.conftest import FAKE_MODELS
from tests.integration.receiver import WEBHOOK_TEST_ENV

ENV = {"BACKFILL_MODELS": FAKE_MODELS, **WEBHOOK_TEST_ENV}
pytestmark = pytest.mark.backfill_env(ENV)
ALL_EVENTS = ["batch.completed", "batch.failed", "batch.expired", "batch.cancelled"]


def http(api: LiveServer, key: str) -> httpx.Client:
    return httpx.Client(base_url=f"{api.base_url}/v1", headers={"Authorization": f"Bearer {key}"}, timeout=30)


def test_the_openai_sdk_registers_reads_updates_and_deletes_an_endpoint(api: LiveServer) -> None:
    client = api.client(make_key("acme"))
    created = client.webhooks.create(name="ci", url="http://127.0.0.1:9/hook", event_types=["batch.completed"])
    assert isinstance(created, WebhookEndpointWithSecret) and created.signing_secret.startswith("whsec_")
    assert created.id.startswith("whep_") and created.event_types == ["batch.completed"]
    listed = list(client.webhooks.list())
    assert [e.id for e in listed] == [created.id] and isinstance(listed[0], WebhookEndpoint)
    assert listed[0].signing_secret_hint == f"whsec_…{created.signing_secret[-4:]}"
    assert "signing_secret" not in listed[0].model_dump() and "signing_secret" not in (listed[0].model_extra or {})
    updated = client.webhooks.update(created.id, name="renamed", event_types=["batch.failed", "batch.completed"])
    assert updated.name == "renamed" and updated.event_types == ["batch.completed", "batch.failed"]
    assert client.webhooks.retrieve(created.id).name == "renamed"
    rotated = client.webhooks.rotate_secret(created.id)
    assert rotated.signing_secret.startswith("whsec_") and rotated.signing_secret != created.signing_secret
    deleted = client.webhooks.delete(created.id)
    assert isinstance(deleted, DeletedWebhookEndpoint) and deleted.deleted and deleted.id == created.id
    assert list(client.webhooks.list()) == []
    with pytest.raises(openai.NotFoundError):
        client.webhooks.retrieve(created.id)


def test_the_backfill_path_subscribes_to_every_batch_event_by_default(api: LiveServer) -> None:
    with http(api, make_key("acme")) as client:
        created = client.post("/webhooks", json={"url": "http://127.0.0.1:9/in"}).json()
        assert created["event_types"] == ALL_EVENTS and created["name"] == "127.0.0.1"
        assert created["signing_secret"].startswith("whsec_") and created["object"] == "webhook_endpoint"
        page = client.get("/webhooks").json()
        assert page["object"] == "list" and [e["id"] for e in page["data"]] == [created["id"]]
        assert "signing_secret" not in page["data"][0]
        assert client.get(f"/webhooks/{created['id']}/deliveries").json()["data"] == []
        assert client.get("/webhook_event_types").json() == {"object": "list", "data": ALL_EVENTS}
        assert client.delete(f"/webhooks/{created['id']}").json()["deleted"] is True
        assert client.get("/webhooks").json()["data"] == []


REFUSED = [
    ("http://10.1.2.3/hook", "private address"),
    ("http://192.168.0.10:8080/hook", "private address"),
    ("http://169.254.169.254/latest/meta-data/", "cloud metadata"),
    ("http://[::1]:8080/hook", "loopback"),
    ("http://127.0.0.2/hook", "loopback"),  # only 127.0.0.1/32 is allowed in these tests
    ("http://0.0.0.0:9/hook", "unspecified"),
    ("http://user:secret@127.0.0.1:9/hook", "credentials"),
    ("ftp://127.0.0.1/hook", "https"),
    ("http://no-such-host.invalid/hook", "does not resolve"),
]


def test_private_metadata_and_malformed_targets_are_refused_at_registration(api: LiveServer) -> None:
    client = api.client(make_key("acme"))
    for url, reason in REFUSED:
        with pytest.raises(openai.BadRequestError) as error:
            client.webhooks.create(name="x", url=url, event_types=["batch.completed"])
        assert error.value.code == "invalid_webhook_url" and error.value.param == "url", url
        assert reason in error.value.message, (url, error.value.message)
    assert list(client.webhooks.list()) == []


@pytest.mark.backfill_env({"BACKFILL_MODELS": FAKE_MODELS})
def test_plain_http_and_loopback_are_refused_unless_the_operator_allows_them(api: LiveServer) -> None:
    client = api.client(make_key("acme"))
    with pytest.raises(openai.BadRequestError) as error:
        client.webhooks.create(name="x", url="http://127.0.0.1:9/hook", event_types=["batch.completed"])
    assert "must use https" in error.value.message
    with pytest.raises(openai.BadRequestError) as error:
        client.webhooks.create(name="x", url="https://127.0.0.1:9/hook", event_types=["batch.completed"])
    assert "loopback address" in error.value.message


def test_bad_fields_get_the_openai_error_envelope(api: LiveServer) -> None:
    with http(api, make_key("acme")) as client:
        for body, param in (
            ({"url": "http://127.0.0.1:9/", "event_types": ["batch.done"]}, "event_types"),
            ({"url": "http://127.0.0.1:9/", "event_types": []}, "event_types"),
            ({"url": "http://127.0.0.1:9/" + "a" * 3000}, "url"),
            ({"url": "http://127.0.0.1:9/", "name": "n" * 201}, "name"),
            ({"url": 5}, "url"),
            ({}, "url"),
        ):
            response = client.post("/webhooks", json=body)
            assert response.status_code == 400, body
            error = response.json()["error"]
            assert error["param"] == param and error["type"] == "invalid_request_error" and error["message"]
        response = client.get("/webhooks", params={"limit": 1000})
        assert response.status_code == 400 and response.json()["error"]["param"] == "limit"


@pytest.mark.backfill_env({**ENV, "BACKFILL_WEBHOOK_ENDPOINTS_PER_TENANT_MAX": "2"})
def test_a_tenant_may_register_only_a_bounded_number_of_endpoints(api: LiveServer) -> None:
    client = api.client(make_key("acme"))
    for i in range(2):
        client.webhooks.create(name=f"e{i}", url=f"http://127.0.0.1:9/{i}", event_types=["batch.completed"])
    with pytest.raises(openai.BadRequestError) as error:
        client.webhooks.create(name="e2", url="http://127.0.0.1:9/2", event_types=["batch.completed"])
    assert error.value.code == "too_many_webhook_endpoints"
    other = api.client(make_key("globex"))  # the limit is per tenant
    other.webhooks.create(name="g", url="http://127.0.0.1:9/g", event_types=["batch.completed"])


def test_tenants_cannot_see_change_or_delete_each_others_endpoints(api: LiveServer) -> None:
    a_key, b_key = make_key("acme"), make_key("globex")
    mine = api.client(a_key).webhooks.create(name="a", url="http://127.0.0.1:9/a", event_types=["batch.completed"])
    other = api.client(b_key)
    assert list(other.webhooks.list()) == []
    for call in (
        lambda: other.webhooks.retrieve(mine.id),
        lambda: other.webhooks.update(mine.id, name="stolen"),
        lambda: other.webhooks.rotate_secret(mine.id),
        lambda: other.webhooks.delete(mine.id),
    ):
        with pytest.raises(openai.NotFoundError) as error:
            call()
        assert error.value.code == "webhook_endpoint_not_found"
    with http(api, b_key) as client:
        for response in (client.get(f"/webhooks/{mine.id}/deliveries"), client.delete(f"/webhooks/{mine.id}")):
            assert response.status_code == 404
    kept = api.client(a_key).webhooks.retrieve(mine.id)
    assert kept.name == "a" and kept.updated_at == mine.updated_at
