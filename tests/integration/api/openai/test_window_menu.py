"""A price for every deadline (issue 40 §3) through the official openai SDK: the estimate's menu of windows, a batch on
a window other than 24h, and its predicted finish checked against its actual one (metric and console)."""

from __future__ import annotations

import json
import re
from decimal import Decimal

import httpx
import openai
import pytest

from storage.db import transaction
from storage.models import Batch
from tests.conftest import LiveServer, make_key
from tests.integration.api.conftest import FAKE_MODELS
from tests.integration.api.helpers import chat_line, to_jsonl, upload, wait_for

WINDOWS = {"24h": "0.5", "1h": "0.2", "background": "0.6"}
pytestmark = pytest.mark.backfill_env(
    {"BACKFILL_MODELS": FAKE_MODELS, "BACKFILL_COMPLETION_WINDOWS": json.dumps(WINDOWS)}
)


def finish_samples(server: LiveServer, window: str) -> float:
    """How many batches on `window` completed with a predicted finish, as /metrics counts them."""
    text = httpx.get(f"{server.base_url}/metrics").text
    pattern = rf'^backfill_batch_finish_error_seconds_count\{{outcome="completed",window="{window}"\}} (\S+)$'
    found = re.search(pattern, text, re.MULTILINE)
    assert found is not None, f"no finish-error series for {window}"
    return float(found.group(1))


def test_the_estimate_answers_a_menu_of_every_offered_window_beside_its_usual_fields(api: LiveServer) -> None:
    client = api.client(make_key("acme"))
    source = upload(client, to_jsonl([chat_line(i, max_tokens=50) for i in range(4)]))
    body = {"input_file_id": source.id, "endpoint": "/v1/chat/completions", "completion_window": "24h"}

    estimate = client.post("/batches/estimate", body=body, cast_to=object)

    assert estimate["object"] == "batch.estimate" and estimate["requests"] == 4  # the fields clients already read
    assert {"finish_at", "deadline_at", "fits_window", "cost", "throughput", "backlog"} <= set(estimate)
    menu = estimate["windows"]
    assert [option["completion_window"] for option in menu] == ["1h", "24h", "background"]
    by_window = {option["completion_window"]: option for option in menu}
    assert by_window["1h"]["deadline_at"] - estimate["deadline_at"] == 3600 - 86_400
    assert by_window["background"]["deadline_at"] is None
    assert all(option["admitted"] and option["fits_window"] for option in menu)  # an empty queue
    assert by_window["24h"]["price"]["billed_usd"] == estimate["cost"]["billed_usd"]  # one pricing function
    billed = [Decimal(option["price"]["billed_usd"]) for option in menu]
    assert billed == sorted(billed, reverse=True)  # a longer window, a deeper discount here


def test_a_batch_on_the_1h_window_runs_and_its_finish_is_checked_against_the_prediction(api: LiveServer) -> None:
    client = api.client(make_key("acme"))
    before = finish_samples(api, "1h")
    source = upload(client, to_jsonl([chat_line(i) for i in range(3)]))

    created = client.batches.create(
        input_file_id=source.id,
        endpoint="/v1/chat/completions",
        completion_window="1h",  # type: ignore[arg-type]  # the SDK's type says "24h"; the wire takes any string
    )
    done = wait_for(client, created.id)

    assert done.status == "completed" and done.completion_window == "1h"
    assert done.expires_at == done.created_at + 3600
    with transaction() as session:
        predicted = session.get(Batch, done.id).predicted_finish_at  # type: ignore[union-attr]
    assert predicted is not None and done.created_at <= predicted <= done.expires_at
    assert finish_samples(api, "1h") == before + 1
    overview = httpx.get(
        f"{api.base_url}/v1/console/overview", headers={"Authorization": f"Bearer {make_key('ops', admin=True)}"}
    ).json()
    (hour,) = [row for row in overview["finish_errors"] if row["completion_window"] == "1h"]
    assert hour["batches"] >= 1 and hour["expired"] == 0


def test_a_window_the_server_does_not_offer_is_refused_by_the_estimate_and_by_create(api: LiveServer) -> None:
    client = api.client(make_key("acme"))
    source = upload(client, to_jsonl([chat_line(0)]))
    body = {"input_file_id": source.id, "endpoint": "/v1/chat/completions", "completion_window": "4h"}

    for path in ("/batches/estimate", "/batches"):
        with pytest.raises(openai.BadRequestError) as refused:
            client.post(path, body=body, cast_to=object)
        assert refused.value.status_code == 400 and refused.value.param == "completion_window"  # type: ignore[attr-defined]
        assert "this server offers 1h, 24h, background" in str(refused.value)
