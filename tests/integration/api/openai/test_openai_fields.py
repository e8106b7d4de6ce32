"""OpenAI's current batch fields through the official SDK, on the fake engine: `usage`, `/v1/responses`,
over-long output caps, endpoint vs model, `output_expires_after`.

The same flows run on the real vLLM engine in tests/e2e/test_openai_fields.py.
"""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

import openai
import pytest
from openai.types import Batch
from openai.types.chat import ChatCompletion
from openai.types.responses import Response

from tests.conftest import LiveServer, make_key
from tests.integration.api.helpers import chat_line, read_lines, to_jsonl, upload, wait_for

# Names of their own: a worker's engines are cached per model name for the whole test session.
MODELS = json.dumps(
    {
        "ctx-model": {"path": "fake:", "max_num_seqs": 8, "max_model_len": 2048},
        "ctx-embed": {"path": "fake:", "runner": "pooling"},
    }
)
pytestmark = pytest.mark.backfill_env({"BACKFILL_MODELS": MODELS})


def run(client: Any, lines: list[dict[str, Any]], endpoint: str = "/v1/chat/completions", **create: Any) -> Batch:
    source = upload(client, to_jsonl(lines))
    batch = client.batches.create(input_file_id=source.id, endpoint=endpoint, completion_window="24h", **create)
    return wait_for(client, batch.id)


def line(i: int, **extra: Any) -> dict[str, Any]:
    return chat_line(i, model="ctx-model", **extra)


def responses_line(i: int, **body: Any) -> dict[str, Any]:
    return {
        "custom_id": f"resp-{i}",
        "method": "POST",
        "url": "/v1/responses",
        "body": {"model": "ctx-model", "input": f"question {i}", **body},
    }


def test_max_tokens_beyond_the_context_lands_in_the_error_file_as_a_400_and_is_not_billed(api: LiveServer) -> None:
    client = api.client(make_key("acme"))
    done = run(client, [line(0, max_tokens=10_000_000), line(1, max_tokens=3)])
    assert done.status == "completed" and done.request_counts.completed == 1 and done.request_counts.failed == 1
    (error,) = read_lines(client, done.error_file_id)
    assert error["custom_id"] == "req-0" and error["response"]["status_code"] == 400
    envelope = error["response"]["body"]["error"]
    assert envelope["code"] == "context_length_exceeded" and envelope["param"] == "max_tokens"
    assert envelope["message"].startswith("This model's maximum context length is 2048 tokens. However, you requested")
    (output,) = read_lines(client, done.output_file_id)
    assert output["custom_id"] == "req-1"
    retrieved = client.batches.retrieve(done.id)
    assert retrieved.usage and retrieved.usage.output_tokens == 3  # only the line that ran
    assert retrieved.model_extra["cost"]["output_tokens"] == 3


def test_every_batch_carries_usage_summed_from_its_lines_with_cached_prompt_tokens(api: LiveServer) -> None:
    client = api.client(make_key("acme"))
    system = {"role": "system", "content": "you are terse " * 20}
    lines = [line(i, max_tokens=2, messages=[system, {"role": "user", "content": f"q{i}"}]) for i in range(6)]
    done = run(client, lines)
    assert done.status == "completed"
    bodies = [
        ChatCompletion.model_validate(line["response"]["body"]) for line in read_lines(client, done.output_file_id)
    ]
    usages = [body.usage for body in bodies if body.usage]
    cached = [u.prompt_tokens_details.cached_tokens or 0 for u in usages if u.prompt_tokens_details]
    assert len(cached) == 6 and sum(cached) > 0  # the fake's prefix cache serves the shared system prompt
    retrieved = client.batches.retrieve(done.id)
    usage = retrieved.usage
    assert usage is not None
    assert usage.input_tokens == sum(u.prompt_tokens for u in usages)
    assert usage.input_tokens_details.cached_tokens == sum(cached)
    assert usage.output_tokens == 12 and usage.output_tokens_details.reasoning_tokens == 0
    assert usage.total_tokens == usage.input_tokens + 12
    listed = {batch.id: batch for batch in client.batches.list()}
    assert listed[done.id].usage == usage

    cost = retrieved.model_extra["cost"]
    assert cost["cached_input_tokens"] == sum(cached) and cost["input_tokens"] == usage.input_tokens
    cached_price = Decimal(cost["cached_input_usd_per_mtok"])
    assert cached_price == Decimal("0.300000")  # the demo list input price 0.60 x the default factor 0.5
    full = Decimal(usage.input_tokens) * Decimal("0.60") + 12 * Decimal("2.40")
    expected = (full - sum(cached) * (Decimal("0.60") - cached_price)) / 1_000_000
    assert abs(Decimal(cost["list_usd"]) - expected) <= Decimal("0.000001")


def test_a_batch_created_just_now_shows_zero_usage(api: LiveServer) -> None:
    client = api.client(make_key("acme"))
    source = upload(client, to_jsonl([line(0)]))
    batch = client.batches.create(input_file_id=source.id, endpoint="/v1/chat/completions", completion_window="24h")
    assert batch.usage and batch.usage.total_tokens == 0 and batch.usage.input_tokens_details.cached_tokens == 0


def test_a_responses_batch_writes_response_objects_the_sdk_parses(api: LiveServer) -> None:
    client = api.client(make_key("acme"))
    lines = [responses_line(i, max_output_tokens=4, instructions="Be brief.") for i in range(5)]
    lines.append(responses_line(9, tools=[{"type": "web_search"}]))
    done = run(client, lines, "/v1/responses")
    assert done.status == "completed" and done.endpoint == "/v1/responses"
    assert done.request_counts.completed == 5 and done.request_counts.failed == 1
    for line in read_lines(client, done.output_file_id):
        response = Response.model_validate(line["response"]["body"])
        assert response.object == "response" and response.model == "ctx-model"
        assert response.output[0].type == "message" and response.output[0].role == "assistant"
        assert response.output[0].content[0].type == "output_text" and len(response.output_text.split()) == 4
        assert response.usage and response.usage.output_tokens == 4
    (error,) = read_lines(client, done.error_file_id)
    assert error["response"]["body"]["error"]["code"] == "unsupported_tool"  # a hosted tool: OpenAI runs those
    assert client.batches.retrieve(done.id).usage.output_tokens == 20  # type: ignore[union-attr]


def test_a_responses_line_in_a_chat_batch_is_reported_by_the_line_checker(api: LiveServer) -> None:
    client = api.client(make_key("acme"))
    done = run(client, [line(0), responses_line(1)])
    assert done.status == "failed" and done.errors and done.errors.data
    assert [(e.code, e.line) for e in done.errors.data] == [("mismatched_url", 2)]


@pytest.mark.parametrize(
    ("endpoint", "model", "line"),
    [
        ("/v1/embeddings", "ctx-model", {"input": "hi"}),
        ("/v1/chat/completions", "ctx-embed", {"messages": [{"role": "user", "content": "hi"}]}),
        ("/v1/responses", "ctx-embed", {"input": "hi"}),
    ],
)
def test_a_model_that_cannot_serve_the_endpoint_is_refused_at_create(
    api: LiveServer, endpoint: str, model: str, line: dict[str, Any]
) -> None:
    client = api.client(make_key("acme"))
    source = upload(
        client, to_jsonl([{"custom_id": "a", "method": "POST", "url": endpoint, "body": {"model": model, **line}}])
    )
    with pytest.raises(openai.BadRequestError) as refused:
        client.batches.create(input_file_id=source.id, endpoint=endpoint, completion_window="24h")  # type: ignore[arg-type]
    assert refused.value.code == "unsupported_endpoint" and refused.value.param == "endpoint"
    assert model in refused.value.message and endpoint in refused.value.message
    assert list(client.batches.list()) == []


def test_an_embeddings_batch_runs_on_an_embedding_model(api: LiveServer) -> None:
    client = api.client(make_key("acme"))
    line = {"custom_id": "e", "method": "POST", "url": "/v1/embeddings", "body": {"model": "ctx-embed", "input": "x"}}
    done = run(client, [line], "/v1/embeddings")
    assert done.status == "completed" and done.request_counts.completed == 1
    assert done.usage and done.usage.output_tokens == 0


@pytest.mark.parametrize("seconds", [60, 3599, 2592001])
def test_output_expires_after_outside_an_hour_to_30_days_is_a_400(api: LiveServer, seconds: int) -> None:
    client = api.client(make_key("acme"))
    source = upload(client, to_jsonl([line(0)]))
    with pytest.raises(openai.BadRequestError) as refused:
        client.batches.create(
            input_file_id=source.id,
            endpoint="/v1/chat/completions",
            completion_window="24h",
            output_expires_after={"anchor": "created_at", "seconds": seconds},
        )
    assert refused.value.param == "output_expires_after.seconds"


def test_output_expires_after_dates_the_output_and_error_files(api: LiveServer) -> None:
    client = api.client(make_key("acme"))
    done = run(
        client,
        [line(0), line(1, temperature=-3)],
        output_expires_after={"anchor": "created_at", "seconds": 7200},
    )
    assert done.output_file_id and done.error_file_id
    for file_id in (done.output_file_id, done.error_file_id):
        result = client.files.retrieve(file_id)
        assert result.expires_at == result.created_at + 7200
    plain = run(client, [line(0)])
    assert plain.output_file_id and client.files.retrieve(plain.output_file_id).expires_at is None


def test_an_unknown_create_field_is_refused_by_name_and_every_sdk_field_is_accepted(api: LiveServer) -> None:
    client = api.client(make_key("acme"))
    source = upload(client, to_jsonl([chat_line(0, model="ctx-model")]))
    for extra in ({"completion_windw": "24h"}, {"urgency": "high"}, {"output_expires_after": None, "x" * 5000: 1}):
        with pytest.raises(openai.BadRequestError) as refused:
            client.batches.create(
                input_file_id=source.id, endpoint="/v1/chat/completions", completion_window="24h", extra_body=extra
            )
        error = refused.value.body
        name = next(key for key in extra if extra[key] is not None)
        assert isinstance(error, dict) and error["code"] == "unknown_parameter", error
        assert len(error["message"]) < 300 and name[:20] in error["message"] and error["param"] == name[:64]
    nested = {"output_expires_after": {"anchor": "created_at", "seconds": 3600, "secs": 1}}
    with pytest.raises(openai.BadRequestError, match=r"output_expires_after\.secs"):
        client.batches.create(
            input_file_id=source.id, endpoint="/v1/chat/completions", completion_window="24h", extra_body=nested
        )
    # Every field of the SDK's BatchCreateParams, at once.
    batch = client.batches.create(
        input_file_id=source.id,
        endpoint="/v1/chat/completions",
        completion_window="24h",
        metadata={"team": "ml"},
        output_expires_after={"anchor": "created_at", "seconds": 7200},
    )
    assert batch.metadata == {"team": "ml"}
