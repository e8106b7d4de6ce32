"""A price for every deadline on Anthropic's side (issue 40 §3): a Message Batch on any offered window through the
anthropic SDK's `extra_body` (`completion_window`, as OpenAI's create names it), and the estimate route taking a
create's body and answering OpenAI's menu of windows. Fake engine; every error in Anthropic's envelope."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import anthropic
import pytest

from storage.db import transaction
from storage.models import Batch
from tests.conftest import LiveServer, make_key
from tests.integration.api.anthropic.batches import ENV, assert_envelope, client_for, raw, req, wait_ended

WINDOWS = {"24h": "0.5", "1h": "0.2", "background": "0.6"}
pytestmark = pytest.mark.backfill_env({**ENV, "BACKFILL_COMPLETION_WINDOWS": json.dumps(WINDOWS)})
REFUSED = "this server offers 1h, 24h, background."
FAR_END = datetime(9999, 12, 31, 23, 59, 59, tzinfo=UTC)  # a background batch's `expires_at`: it never expires


def estimate(client: anthropic.Anthropic, body: dict[str, Any]) -> dict[str, Any]:
    answer: dict[str, Any] = client.post("/v1/messages/batches/estimate", body=body, cast_to=object)
    return answer


def test_a_batch_on_the_1h_window_expires_an_hour_after_create_runs_and_is_billed_at_its_discount(
    api: LiveServer,
) -> None:
    client = client_for(api, make_key("acme"))
    created = client.messages.batches.create(
        requests=[req(f"r{i}") for i in range(3)],  # type: ignore[list-item]
        extra_body={"completion_window": "1h"},
    )
    assert created.expires_at - created.created_at == timedelta(hours=1)
    assert (created.model_extra or {})["completion_window"] == "1h"

    done = wait_ended(client, created.id)
    assert done.request_counts.succeeded == 3 and done.expires_at == created.expires_at
    assert Decimal(client.messages.batches.retrieve(done.id).model_extra["cost"]["discount_pct"]) == 20  # type: ignore[index]
    with transaction() as session:
        row = session.get(Batch, done.id)
        assert row is not None and row.completion_window == "1h"
        assert row.predicted_finish_at is not None  # admitted on its own deadline, as an OpenAI batch is


@pytest.mark.parametrize(
    ("extra", "window", "expires_after"),
    [
        ({}, "24h", timedelta(hours=24)),  # Anthropic's own window: the default
        ({"completion_window": "24h"}, "24h", timedelta(hours=24)),
        ({"completion_window": "1h"}, "1h", timedelta(hours=1)),
        ({"completion_window": "background"}, "background", None),
    ],
)
def test_expires_at_follows_the_window_and_the_sdk_parses_it(
    api: LiveServer, extra: dict[str, str], window: str, expires_after: timedelta | None
) -> None:
    key = make_key("acme")
    client = client_for(api, key)
    created = client.messages.batches.create(requests=[req("a")], extra_body=extra)  # type: ignore[list-item]
    for batch in (created, client.messages.batches.retrieve(created.id), client.messages.batches.list().data[0]):
        assert (batch.model_extra or {})["completion_window"] == window
        if expires_after is None:  # no deadline: the latest RFC 3339 time, a datetime the SDK's type holds
            assert batch.expires_at == FAR_END
        else:
            assert batch.expires_at - batch.created_at == expires_after
    wire = raw(api, "GET", f"/v1/messages/batches/{created.id}", headers={"x-api-key": key}).json()
    if expires_after is None:
        assert wire["expires_at"] == "9999-12-31T23:59:59Z"


@pytest.mark.parametrize("window", ["4h", "", 5, ["1h"], {"window": "1h"}, None])
def test_a_window_the_server_does_not_offer_is_a_400_naming_the_offered_ones_from_create_and_estimate(
    api: LiveServer, window: object
) -> None:
    key = make_key("acme")
    body = {"requests": [req("a")], "completion_window": window}
    for path in ("/v1/messages/batches", "/v1/messages/batches/estimate"):
        response = raw(api, "POST", path, json=body, headers={"x-api-key": key})
        assert_envelope(response, 400, "invalid_request_error", "Invalid completion_window ")
        assert response.json()["error"]["message"].endswith(REFUSED)
    if isinstance(window, str):
        assert f"Invalid completion_window '{window}':" in response.json()["error"]["message"]
    assert client_for(api, key).messages.batches.list().data == []  # nothing was created


def test_the_estimate_answers_the_menu_of_every_offered_window_and_creates_nothing(api: LiveServer) -> None:
    client = client_for(api, make_key("acme"))
    requests = [req(f"r{i}", max_tokens=50) for i in range(4)]

    answer = estimate(client, {"requests": requests, "completion_window": "1h", "priority": 0})

    assert answer["object"] == "batch.estimate" and answer["model"] == "fake-model"
    assert (answer["requests"], answer["completion_window"], answer["skipped_lines"]) == (4, "1h", 0)
    assert {"finish_at", "deadline_at", "fits_window", "cost", "throughput", "backlog"} <= set(answer)
    menu = answer["windows"]
    assert [option["completion_window"] for option in menu] == ["1h", "24h", "background"]
    by_window = {option["completion_window"]: option for option in menu}
    assert by_window["1h"]["deadline_at"] == answer["deadline_at"]  # the window asked for heads the answer
    assert by_window["24h"]["deadline_at"] - by_window["1h"]["deadline_at"] == 86_400 - 3600
    assert by_window["background"]["deadline_at"] is None
    assert all(option["admitted"] and option["fits_window"] for option in menu)  # an empty queue
    assert by_window["1h"]["price"]["billed_usd"] == answer["cost"]["billed_usd"]  # one pricing function
    assert [option["price"]["discount_pct"] for option in menu] == ["20.00", "50.00", "60.00"]
    assert len({option["price"]["list_usd"] for option in menu}) == 1  # one list price, each window's discount
    assert Decimal(answer["cost"]["list_usd"]) >= Decimal("0.000800")  # 4 x 50 output tokens at $4/Mtok, and input
    assert estimate(client, {"requests": requests})["completion_window"] == "24h"  # the default, as on create
    assert client.messages.batches.list().data == []


def test_the_estimate_refuses_what_create_refuses_and_one_that_mixes_models(api: LiveServer) -> None:
    key = make_key("acme")
    headers = {"x-api-key": key}
    path = "/v1/messages/batches/estimate"
    shape = {"requests": [req("ok"), req("bad id"), {"custom_id": "c"}]}
    assert_envelope(raw(api, "POST", path, json=shape, headers=headers), 400, "invalid_request_error", "indices 1-2")
    extra = {"requests": [req("a")], "webhook": "https://example.com"}
    says = "webhook: Extra inputs are not permitted"
    assert_envelope(raw(api, "POST", path, json=extra, headers=headers), 400, "invalid_request_error", says)
    for bad in ({"priority": "high"}, {"max_cost_usd": "lots"}):
        body = {"requests": [req("a")], **bad}
        assert_envelope(
            raw(api, "POST", path, json=body, headers=headers), 400, "invalid_request_error", next(iter(bad))
        )
    background_expiry = {
        "requests": [req("a")],
        "completion_window": "background",
        "on_expiry": "continue_in_background",
    }
    response = raw(api, "POST", "/v1/messages/batches", json=background_expiry, headers=headers)  # the create's rule
    assert_envelope(response, 400, "invalid_request_error", "a batch of the background tier never expires")
    mixed = {"requests": [req("a"), req("b", model="other-model")]}
    says = "An estimate covers one model, and these requests name more than one (the first: 'fake-model')"
    assert_envelope(raw(api, "POST", path, json=mixed, headers=headers), 400, "invalid_request_error", says)
    unserved = {"requests": [req("a", model="claude-nope")]}
    says = "The model 'claude-nope' is not served here"  # as the OpenAI estimate says it
    assert_envelope(raw(api, "POST", path, json=unserved, headers=headers), 400, "invalid_request_error", says)


def test_the_estimate_body_is_bounded_as_the_create_body_is(api: LiveServer) -> None:
    headers = {"x-api-key": make_key("acme")}
    big = {"requests": [req(f"r{i}", system="x" * 2000) for i in range(40)]}  # > 64 KiB, the create's limit here
    path = "/v1/messages/batches/estimate"
    assert_envelope(raw(api, "POST", path, json=big, headers=headers), 413, "request_too_large")
    chunked = raw(api, "POST", path, content=iter([json.dumps(big).encode()]), headers=headers)
    assert_envelope(chunked, 413, "request_too_large")  # no Content-Length: counted while streaming
