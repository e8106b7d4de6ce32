"""Batches through the official openai SDK, with the in-process worker on the fake engine."""

from __future__ import annotations

import time

import openai
import pytest
from openai.types.chat import ChatCompletion

from tests.conftest import LiveServer, make_key
from tests.integration.api.conftest import FAKE_MODELS
from tests.integration.api.helpers import chat_line, read_lines, to_jsonl, upload, wait_for

pytestmark = pytest.mark.backfill_env({"BACKFILL_MODELS": FAKE_MODELS})


def test_a_batch_runs_to_completion_with_one_line_per_request(api: LiveServer) -> None:
    client = api.client(make_key("acme"))
    source = upload(client, to_jsonl([chat_line(i) for i in range(25)]))
    batch = client.batches.create(
        input_file_id=source.id, endpoint="/v1/chat/completions", completion_window="24h", metadata={"team": "ml"}
    )
    assert batch.status in {"validating", "in_progress", "finalizing", "completed"}
    assert batch.expires_at == batch.created_at + 24 * 3600
    done = wait_for(client, batch.id)
    assert done.status == "completed", done
    assert done.request_counts.total == 25 and done.request_counts.completed == 25
    assert done.metadata == {"team": "ml"} and done.model == "fake-model"
    assert done.in_progress_at and done.finalizing_at and done.completed_at
    lines = read_lines(client, done.output_file_id)
    assert sorted(line["custom_id"] for line in lines) == sorted(f"req-{i}" for i in range(25))
    for line in lines:
        assert line["error"] is None and line["response"]["status_code"] == 200
        ChatCompletion.model_validate(line["response"]["body"])
    assert done.error_file_id is None
    assert client.files.retrieve(done.output_file_id).purpose == "batch_output"


def test_an_azure_batch_file_with_unversioned_urls_runs_as_its_openai_twin(api: LiveServer) -> None:
    """Azure OpenAI's batch files and docs write `/chat/completions` for the line's url and the batch's endpoint."""
    client = api.client(make_key("acme"))
    lines = [{**chat_line(i), "url": "/chat/completions"} for i in range(3)]
    batch = client.batches.create(
        input_file_id=upload(client, to_jsonl(lines)).id, endpoint="/chat/completions", completion_window="24h"
    )
    done = wait_for(client, batch.id)
    assert done.endpoint == "/v1/chat/completions" and done.request_counts.completed == 3, done


def test_batches_list_paginates_newest_first(api: LiveServer) -> None:
    client = api.client(make_key("acme"))
    source = upload(client, to_jsonl([chat_line(0)]))
    created = [
        client.batches.create(input_file_id=source.id, endpoint="/v1/chat/completions", completion_window="24h").id
        for _ in range(5)
    ]
    page = client.batches.list(limit=2)
    assert page.has_more is True and len(page.data) == 2
    assert page.first_id == page.data[0].id and page.last_id == page.data[1].id
    every = [batch.id for batch in client.batches.list(limit=2)]  # the SDK follows `after` pages
    assert every == list(reversed(created))
    assert list(api.client(make_key("globex")).batches.list()) == []


def test_cancel_moves_through_cancelling_to_cancelled(api: LiveServer) -> None:
    client = api.client(make_key("acme"))
    source = upload(client, to_jsonl([chat_line(i, max_tokens=2 if i < 4 else 10**8) for i in range(40)]))
    batch = client.batches.create(input_file_id=source.id, endpoint="/v1/chat/completions", completion_window="24h")
    wait_for(client, batch.id, {"in_progress"})
    while client.batches.retrieve(batch.id).request_counts.completed < 4:
        time.sleep(0.05)
    cancelling = client.batches.cancel(batch.id)
    assert cancelling.status == "cancelling" and cancelling.cancelling_at
    done = wait_for(client, batch.id)
    assert done.status == "cancelled" and done.cancelled_at
    errors = read_lines(client, done.error_file_id)
    outputs = read_lines(client, done.output_file_id)
    assert len(outputs) == 4 and len(errors) == 36
    assert {line["custom_id"] for line in errors}.isdisjoint({line["custom_id"] for line in outputs})
    assert all(line["error"]["code"] == "batch_cancelled" for line in errors)
    with pytest.raises(openai.ConflictError):
        client.batches.cancel(batch.id)


def test_foreign_and_missing_batches_are_404(api: LiveServer) -> None:
    client = api.client(make_key("acme"))
    source = upload(client, to_jsonl([chat_line(0)]))
    batch = client.batches.create(input_file_id=source.id, endpoint="/v1/chat/completions", completion_window="24h")
    other = api.client(make_key("globex"))
    for call in (lambda: other.batches.retrieve(batch.id), lambda: other.batches.cancel(batch.id)):
        with pytest.raises(openai.NotFoundError):
            call()
    with pytest.raises(openai.NotFoundError):
        other.batches.create(input_file_id=source.id, endpoint="/v1/chat/completions", completion_window="24h")


def test_unknown_model_window_and_endpoint_are_400(api: LiveServer) -> None:
    client = api.client(make_key("acme"))
    unknown = upload(client, to_jsonl([chat_line(0, model="gpt-17")]))
    with pytest.raises(openai.BadRequestError) as model_error:
        client.batches.create(input_file_id=unknown.id, endpoint="/v1/chat/completions", completion_window="24h")
    assert model_error.value.code == "model_not_found" and "gpt-17" in model_error.value.message
    good = upload(client, to_jsonl([chat_line(0)]))
    with pytest.raises(openai.BadRequestError) as window_error:
        client.batches.create(input_file_id=good.id, endpoint="/v1/chat/completions", completion_window="1h")
    assert window_error.value.param == "completion_window"
    with pytest.raises(openai.BadRequestError):
        client.batches.create(input_file_id=good.id, endpoint="/v1/moderations", completion_window="24h")  # type: ignore[arg-type]
    with pytest.raises(openai.BadRequestError):
        client.batches.create(
            input_file_id=good.id,
            endpoint="/v1/chat/completions",
            completion_window="24h",
            metadata={f"k{i}": "v" for i in range(17)},
        )
    assert list(client.batches.list()) == []


def test_models_lists_the_registry(api: LiveServer) -> None:
    ids = {model.id for model in api.client(make_key("acme")).models.list()}
    assert ids == {"fake-model", "other-model"}


def test_estimate_is_a_dry_run_with_cost_and_finish_time(api: LiveServer) -> None:
    key = make_key("acme")
    client = api.client(key)
    source = upload(client, to_jsonl([chat_line(i, max_tokens=100) for i in range(10)]))
    response = client.post(
        "/batches/estimate",
        body={"input_file_id": source.id, "endpoint": "/v1/chat/completions", "completion_window": "24h"},
        cast_to=object,
    )
    assert response["object"] == "batch.estimate" and response["model"] == "fake-model"
    assert response["requests"] == 10 and response["cost"]["output_tokens"] == 1000
    assert float(response["cost"]["compute_usd"]) > 0 and float(response["cost"]["billed_usd"]) > 0
    assert response["fits_window"] is True and response["finish_at"] >= response["start_at"]
    assert list(client.batches.list()) == []
