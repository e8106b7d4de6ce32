"""Moderations, structured output in every dialect and the cached-input price, through the official SDKs and the real
API with the in-process worker on the fake engine (a fake classifier beside a fake chat model), on both backends.

The real engine runs the same flows in tests/e2e/api/test_moderations_and_formats.py.
"""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

import anthropic
import jsonschema
import openai
import pytest
from anthropic.types import Message
from openai.types import Batch, ModerationCreateResponse
from openai.types.chat import ChatCompletion
from openai.types.responses import Response

from tests.conftest import LiveServer, make_key
from tests.integration.api.helpers import read_lines, to_jsonl, upload, wait_for
from tests.media_server import data_url, png_bytes
from worker.engine.fake import FAKE_IMAGE_TOKENS

CHAT, CLASSIFIER = "fmt-chat", "fmt-moderation"  # names of their own: engines are cached per model name
MODELS = {
    CHAT: {"path": "fake:", "max_num_seqs": 8, "max_model_len": 4096},
    CLASSIFIER: {"path": "fake:", "runner": "pooling", "convert": "classify", "max_num_seqs": 8},
}
PRICES = {
    "cached_input_factor": "0.25",
    "prices": [
        {"model": CHAT, "effective_from": "2025-01-01", "input_usd_per_mtok": "1", "output_usd_per_mtok": "4"},
        {"model": CLASSIFIER, "effective_from": "2025-01-01", "input_usd_per_mtok": "2", "output_usd_per_mtok": "8"},
    ],
}
pytestmark = pytest.mark.backfill_env(
    {"BACKFILL_MODELS": json.dumps(MODELS), "BACKFILL_PRICE_BOOK": json.dumps(PRICES)}
)
SCHEMA: dict[str, Any] = {  # pydantic's shape for a nested model and an Optional field, with a JSON Schema header
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "$id": "https://example.com/review.schema.json",
    "$defs": {
        "Tag": {"type": "object", "properties": {"name": {"type": "string", "minLength": 1}}, "required": ["name"]}
    },
    "type": "object",
    "properties": {
        "verdict": {"enum": ["good", "bad"]},
        "score": {"anyOf": [{"type": "integer", "minimum": 1}, {"type": "null"}], "default": None},
        "tag": {"$ref": "#/$defs/Tag"},
    },
    "required": ["verdict", "score", "tag"],
    "additionalProperties": False,
}


def run(client: openai.OpenAI, lines: list[dict[str, Any]], endpoint: str) -> Batch:
    source = upload(client, to_jsonl(lines))
    batch = client.batches.create(input_file_id=source.id, endpoint=endpoint, completion_window="24h")  # type: ignore[arg-type]
    return wait_for(client, batch.id)


def line(custom_id: str, url: str, **body: Any) -> dict[str, Any]:
    return {"custom_id": custom_id, "method": "POST", "url": url, "body": body}


def test_a_moderations_batch_runs_lines_that_name_no_model_on_the_registrys_classifier(api: LiveServer) -> None:
    client = api.client(make_key("acme"))
    image = {"type": "image_url", "image_url": {"url": data_url(png_bytes())}}
    broken = {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}
    lines = [
        line("one", "/v1/moderations", input="I will hurt you"),
        line("many", "/v1/moderations", input=["have a nice day", "how do I bake bread?"]),
        line("named", "/v1/moderations", model=CLASSIFIER, input=[{"type": "text", "text": "a text part"}]),
        line("image", "/v1/moderations", input=[{"type": "text", "text": "look"}, image]),
        line("broken", "/v1/moderations", input=[{"type": "text", "text": "look"}, broken]),
    ]
    done = run(client, lines, "/v1/moderations")
    assert done.status == "completed" and done.request_counts
    assert (done.request_counts.completed, done.request_counts.failed) == (4, 1)
    outputs = {entry["custom_id"]: entry["response"]["body"] for entry in read_lines(client, done.output_file_id)}
    answers = {custom_id: ModerationCreateResponse.model_validate(body) for custom_id, body in outputs.items()}
    assert [len(answers[c].results) for c in ("one", "many", "named", "image")] == [1, 2, 1, 1]
    assert all(answer.model == CLASSIFIER and answer.id.startswith("modr-") for answer in answers.values())
    applied = answers["image"].results[0].category_applied_input_types
    assert (applied.violence, applied.hate) == (["text", "image"], ["text"])  # images scored as OpenAI scores them
    assert answers["one"].results[0].category_applied_input_types.violence == ["text"]
    (error,) = read_lines(client, done.error_file_id)
    assert error["custom_id"] == "broken" and error["response"]["status_code"] == 400
    assert error["response"]["body"]["error"]["code"] == "invalid_image"
    assert error["response"]["body"]["error"]["param"] == "input"
    # Billed as input only, at the classifier's price: the fake counts a token per word (and a turn's 2 and an
    # image's FAKE_IMAGE_TOKENS for an input with images).
    assert done.usage is not None and done.usage.output_tokens == 0
    assert done.usage.input_tokens == 4 + 9 + 3 + (1 + 2 + FAKE_IMAGE_TOKENS)
    cost = (done.model_extra or {})["cost"]
    assert Decimal(cost["list_usd"]) == Decimal(done.usage.input_tokens * 2) / 1_000_000


def test_a_moderations_batch_for_a_model_that_does_not_classify_is_refused_at_create(api: LiveServer) -> None:
    client = api.client(make_key("acme"))
    source = upload(client, to_jsonl([line("a", "/v1/moderations", model=CHAT, input="x")]))
    with pytest.raises(openai.BadRequestError) as refused:
        client.batches.create(input_file_id=source.id, endpoint="/v1/moderations", completion_window="24h")
    error = refused.value.body
    assert isinstance(error, dict) and error["code"] == "unsupported_endpoint"
    assert f"Models that do: {CLASSIFIER}" in error["message"]


def test_structured_output_parses_against_its_schema_in_every_dialect(api: LiveServer) -> None:
    key = make_key("acme")
    client = api.client(key)
    question = [{"role": "user", "content": "Review the film."}]
    chat = run(
        client,
        [
            line(
                "chat",
                "/v1/chat/completions",
                model=CHAT,
                messages=question,
                response_format={
                    "type": "json_schema",
                    "json_schema": {"name": "review", "schema": SCHEMA, "strict": True},
                },
            )
        ],
        "/v1/chat/completions",
    )
    (out,) = read_lines(client, chat.output_file_id)
    completion = ChatCompletion.model_validate(out["response"]["body"])
    jsonschema.validate(json.loads(completion.choices[0].message.content or ""), SCHEMA)
    text_format = {"format": {"type": "json_schema", "name": "review", "schema": SCHEMA, "strict": True}}
    responses = run(
        client, [line("resp", "/v1/responses", model=CHAT, input="Review the film.", text=text_format)], "/v1/responses"
    )
    (out,) = read_lines(client, responses.output_file_id)
    response = Response.model_validate(out["response"]["body"])
    jsonschema.validate(json.loads(response.output_text), SCHEMA)
    assert response.text and response.text.format and response.text.format.type == "json_schema"

    anthropic_client = anthropic.Anthropic(api_key=key, base_url=api.base_url, max_retries=0, timeout=60)
    params = {"model": CHAT, "max_tokens": 64, "messages": question}
    params["output_config"] = {"format": {"type": "json_schema", "schema": SCHEMA}}
    created = anthropic_client.messages.batches.create(requests=[{"custom_id": "msg", "params": params}])  # type: ignore[list-item]
    wait_for_ended(anthropic_client, created.id)
    (result,) = list(anthropic_client.messages.batches.results(created.id))
    assert result.result.type == "succeeded"
    message = Message.model_validate(result.result.message.model_dump())
    assert message.stop_reason == "end_turn" and message.content[0].type == "text"
    jsonschema.validate(json.loads(message.content[0].text), SCHEMA)


def test_an_anthropic_prefix_served_from_the_cache_is_billed_at_the_cached_rate(api: LiveServer) -> None:
    client = anthropic.Anthropic(api_key=make_key("acme"), base_url=api.base_url, max_retries=0, timeout=60)
    system = [{"type": "text", "text": "You review films in one line. " * 20, "cache_control": {"type": "ephemeral"}}]
    shots = [{"role": "user", "content": "Alien"}, {"role": "assistant", "content": "Tense."}]

    def request(custom_id: str) -> dict[str, Any]:
        messages = [*shots, {"role": "user", "content": f"Film {custom_id}"}]
        return {
            "custom_id": custom_id,
            "params": {"model": CHAT, "max_tokens": 4, "system": system, "messages": messages},
        }

    first = client.messages.batches.create(requests=[request("a")])  # type: ignore[list-item]
    wait_for_ended(client, first.id)
    second = client.messages.batches.create(requests=[request("b"), request("c")])  # type: ignore[list-item]
    done = wait_for_ended(client, second.id)
    usages = [line.result.message.usage for line in client.messages.batches.results(second.id)]
    cached = sum(usage.cache_read_input_tokens or 0 for usage in usages)
    total_input = sum(usage.input_tokens + (usage.cache_read_input_tokens or 0) for usage in usages)
    assert cached > 0 and all(usage.cache_read_input_tokens for usage in usages)
    cost = (done.model_extra or {})["cost"]
    assert cost["cached_input_tokens"] == cached and cost["input_tokens"] == total_input
    expected = (Decimal(total_input - cached) * 1 + Decimal(cached) * Decimal("0.25") + 4 * 2 * 4) / 1_000_000
    assert Decimal(cost["list_usd"]) == expected.quantize(Decimal("0.000001"))


def wait_for_ended(client: anthropic.Anthropic, batch_id: str, timeout: float = 60) -> Any:
    import time

    deadline = time.time() + timeout
    while time.time() < deadline:
        batch = client.messages.batches.retrieve(batch_id)
        if batch.processing_status == "ended":
            return batch
        time.sleep(0.1)
    raise AssertionError(f"message batch {batch_id} did not end")
