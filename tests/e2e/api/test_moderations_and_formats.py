"""Moderations and structured output end to end: the official `openai` and `anthropic` SDKs against the real API,
the in-process worker and the real vLLM engine on the demo chat model and the demo moderation classifier (as the
embedded default registers them), one server per backend (SQLite + a local folder, Postgres + S3).

`/v1/moderations` lines with and without a model, text, and text with an image (through vLLM's multimodal processor;
a broken image fails its own line); structured
output in the three dialects (chat `response_format`, Responses `text.format`, Anthropic `output_config.format`)
with the schemas real files carry, every answer re-parsed with the SDK's types and validated against its schema
with jsonschema; a schema the backend cannot compile fails only its own line, naming the field; and the other
fields real files carry (Anthropic `cache_control` on system blocks, `top_k`, `service_tier`, `metadata`; OpenAI
`max_completion_tokens`, `stop: []`, `store: false`, `service_tier`, Responses `include` of logprobs).
"""

from __future__ import annotations

import gc
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import jsonschema
import openai
import pytest
from anthropic.types import Message
from openai.types import Batch, ModerationCreateResponse
from openai.types.chat import ChatCompletion
from openai.types.responses import Response

from tests.conftest import LiveServer, configure, make_key, start_server
from tests.integration.api.helpers import read_lines, to_jsonl, upload, wait_for
from tests.media_server import data_url, png_bytes

pytestmark = pytest.mark.vllm

CHAT, CLASSIFIER = "backfill-demo", "backfill-demo-moderation"
# Schemas as real files carry them, each field bounded (an enum, a maxLength, a range) so that the random-weight
# demo model finishes well within max_tokens: unbounded strings run to the cap on a model that writes noise.
REVIEW: dict[str, Any] = {  # pydantic's shape: $defs/$ref, titles, an Optional field as a nullable anyOf with default
    "$defs": {
        "Step": {
            "properties": {
                "explanation": {"title": "Explanation", "type": "string", "maxLength": 24},
                "output": {"title": "Output", "type": "string", "maxLength": 12},
            },
            "required": ["explanation", "output"],
            "title": "Step",
            "type": "object",
        }
    },
    "properties": {
        "steps": {"items": {"$ref": "#/$defs/Step"}, "title": "Steps", "type": "array", "maxItems": 2},
        "score": {"anyOf": [{"type": "integer", "minimum": 0, "maximum": 10}, {"type": "null"}], "default": None},
    },
    "required": ["steps", "score"],
    "title": "Review",
    "type": "object",
}
EXTRACT: dict[str, Any] = {  # a JSON Schema document: $schema/$id, an enum, a type list, formats, a closed object
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "$id": "https://example.com/company.schema.json",
    "type": "object",
    "properties": {
        "sentiment": {"enum": ["positive", "negative", "neutral"]},
        "founded": {"type": ["integer", "null"], "minimum": 1800, "maximum": 2030},
        "public": {"type": "boolean"},
        "phone": {"type": "string", "format": "phone", "maxLength": 12},  # a format no grammar knows: annotation
        "since": {"type": "string", "format": "date"},
    },
    "required": ["sentiment", "founded", "public", "phone", "since"],
    "additionalProperties": False,
}
UNIQUE = {"type": "object", "properties": {"tags": {"type": "array", "uniqueItems": True}}, "required": ["tags"]}
QUESTION = [{"role": "user", "content": "Review the film Alien and extract what you know."}]


@pytest.fixture(scope="module", params=["embedded", "postgres"])
def live(
    request: pytest.FixtureRequest,
    demo_model_path: Path,
    demo_moderation_model_path: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[LiveServer]:
    """One real-engine server per backend, serving the demo chat model and the demo classifier as the embedded
    default registers them (smaller KV caches)."""
    from storage.settings import Settings
    from worker.cli.migrate import migrate_database
    from worker.process import service

    data = tmp_path_factory.mktemp(f"formats-{request.param}")
    default = Settings(data_dir=data).served_models()
    paths = {CHAT: demo_model_path, CLASSIFIER: demo_moderation_model_path}
    models = {
        name: default[name].model_dump(exclude_none=True)
        | {"path": str(path), "max_num_seqs": 16, "max_model_len": 1024, "kv_cache_memory_bytes": 64 << 20}
        for name, path in paths.items()
    }
    env = {"BACKFILL_DATA_DIR": str(data), "BACKFILL_MODELS": json.dumps(models), "BACKFILL_REAP_INTERVAL_SECONDS": "1"}
    if request.param == "postgres":
        env["BACKFILL_DATABASE_URL"] = request.getfixturevalue("pg_url")
        env["BACKFILL_S3_ENDPOINT_URL"] = request.getfixturevalue("moto_endpoint")
        env["BACKFILL_S3_BUCKET"] = f"backfill-formats-{int(time.time())}"
    service.close_engines()  # engines are cached per model name: other modules' specs must not leak in
    with pytest.MonkeyPatch.context() as patch:
        configure(patch, env)
        migrate_database()
        if request.param == "postgres":
            from storage.files.blobs import get_blob_store

            get_blob_store().ensure_bucket()  # type: ignore[attr-defined]
        server, stop = start_server(with_worker=True)
        try:
            assert server.worker is not None and server.worker.ready.wait(300)  # type: ignore[attr-defined]
            yield server
        finally:
            stop()
            service.close_engines()
            gc.collect()


def line(custom_id: str, url: str, **body: Any) -> dict[str, Any]:
    return {"custom_id": custom_id, "method": "POST", "url": url, "body": body}


def create(client: openai.OpenAI, lines: list[dict[str, Any]], endpoint: str) -> Batch:
    source = upload(client, to_jsonl(lines))
    return client.batches.create(input_file_id=source.id, endpoint=endpoint, completion_window="24h")  # type: ignore[arg-type]


def outcomes(client: openai.OpenAI, batch: Batch) -> tuple[dict[str, Any], dict[str, Any]]:
    done = wait_for(client, batch.id, timeout=240)
    assert done.status == "completed"
    ok = {entry["custom_id"]: entry["response"]["body"] for entry in read_lines(client, done.output_file_id)}
    failed = {entry["custom_id"]: entry["response"]["body"] for entry in read_lines(client, done.error_file_id)}
    return ok, failed


def chat_format(schema: dict[str, Any]) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema, "strict": True}}


def responses_format(schema: dict[str, Any]) -> dict[str, Any]:
    return {"format": {"type": "json_schema", "name": "answer", "schema": schema, "strict": True}}


def test_moderations_and_structured_output_in_every_dialect(live: LiveServer) -> None:
    key = make_key("acme")
    client = live.client(key)
    schemas = {"review": REVIEW, "extract": EXTRACT}
    chat_lines = [
        line(
            f"{name}-{i}",
            "/v1/chat/completions",
            model=CHAT,
            messages=QUESTION,
            max_tokens=256,
            response_format=chat_format(schema),
        )
        for name, schema in schemas.items()
        for i in range(4)
    ]
    chat_lines.append(
        line("unique", "/v1/chat/completions", model=CHAT, messages=QUESTION, response_format=chat_format(UNIQUE))
    )
    chat_lines.append(
        line(
            "fields",
            "/v1/chat/completions",
            model=CHAT,
            messages=QUESTION,
            max_completion_tokens=3,
            stop=[],
            store=False,
            service_tier="flex",
        )
    )
    responses_lines = [
        line(
            f"{name}-{i}",
            "/v1/responses",
            model=CHAT,
            input="Review Alien.",
            max_output_tokens=256,
            text=responses_format(schema),
        )
        for name, schema in schemas.items()
        for i in range(3)
    ]
    responses_lines.append(line("unique", "/v1/responses", model=CHAT, input="x", text=responses_format(UNIQUE)))
    logprobs = {"include": ["message.output_text.logprobs"], "top_logprobs": 2, "store": False}
    responses_lines.append(
        line("logprobs", "/v1/responses", model=CHAT, input="Hello", max_output_tokens=3, **logprobs)
    )
    image = {"type": "image_url", "image_url": {"url": data_url(png_bytes())}}
    broken = {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}
    moderation_lines = [
        line("one", "/v1/moderations", input="I will hurt you"),
        line("many", "/v1/moderations", input=["have a nice day", "how do I bake bread?"]),
        line("parts", "/v1/moderations", input=[{"type": "text", "text": "look at this"}]),
        line("image", "/v1/moderations", input=[{"type": "text", "text": "look at this"}, image]),
        line("broken", "/v1/moderations", input=[{"type": "text", "text": "look at this"}, broken]),
    ]
    system = [{"type": "text", "text": "You answer in JSON.", "cache_control": {"type": "ephemeral", "ttl": "1h"}}]
    requests = [
        {
            "custom_id": f"{name}-{i}",
            "params": {
                "model": CHAT,
                "max_tokens": 256,
                "messages": QUESTION,
                "output_config": {"format": {"type": "json_schema", "schema": schema}},
            },
        }
        for name, schema in schemas.items()
        for i in range(3)
    ]
    unique = {"format": {"type": "json_schema", "schema": UNIQUE}}
    requests.append(
        {
            "custom_id": "unique",
            "params": {"model": CHAT, "max_tokens": 16, "messages": QUESTION, "output_config": unique},
        }
    )
    fields = {
        "system": system,
        "top_k": 20,
        "service_tier": "standard_only",
        "metadata": {"user_id": "u-1"},
        "stream": False,
    }
    requests.append(
        {
            "custom_id": "fields",
            "params": {
                "model": CHAT,
                "max_tokens": 4,
                "messages": QUESTION,
                "cache_control": {"type": "ephemeral"},
                **fields,
            },
        }
    )

    # A raw prompt on a model that thinks first (the demo's reasoning parser) cannot be held to a schema.
    completion_line = line("raw", "/v1/completions", model=CHAT, prompt="JSON:", response_format=chat_format(EXTRACT))
    started = time.monotonic()
    anthropic_client = anthropic.Anthropic(api_key=key, base_url=live.base_url, max_retries=0, timeout=120)
    message_batch = anthropic_client.messages.batches.create(requests=requests)  # type: ignore[arg-type]
    batches = [
        create(client, chat_lines, "/v1/chat/completions"),
        create(client, responses_lines, "/v1/responses"),
        create(client, moderation_lines, "/v1/moderations"),
        create(client, [completion_line], "/v1/completions"),
    ]
    (chat_ok, chat_failed), (responses_ok, responses_failed), (moderated, refused), (_, raw_prompt) = (
        outcomes(client, batch) for batch in batches
    )

    # Moderations: OpenAI's answer, from the classifier's 13 labels; the model the lines did not name.
    answers = {custom_id: ModerationCreateResponse.model_validate(body) for custom_id, body in moderated.items()}
    assert {c: len(a.results) for c, a in answers.items()} == {"one": 1, "many": 2, "parts": 1, "image": 1}
    for answer in answers.values():
        assert answer.model == CLASSIFIER and answer.id.startswith("modr-")
        for result in answer.results:
            scores = result.category_scores.model_dump(by_alias=True)
            assert len(scores) == 13 and all(0.0 <= score <= 1.0 for score in scores.values())
            assert result.flagged == any(result.categories.model_dump().values())
    applied = answers["image"].results[0].category_applied_input_types
    assert (applied.violence, applied.hate) == (["text", "image"], ["text"])
    assert answers["image"].results[0].category_scores != answers["parts"].results[0].category_scores  # it saw it
    assert list(refused) == ["broken"] and refused["broken"]["error"]["code"] == "invalid_image"

    # Structured output: every answer parses against its schema, in every dialect.
    for custom_id, body in chat_ok.items():
        completion = ChatCompletion.model_validate(body)
        if custom_id == "fields":
            assert completion.usage and completion.usage.completion_tokens == 3 and completion.service_tier == "default"
            continue
        assert completion.choices[0].finish_reason == "stop"
        jsonschema.validate(json.loads(completion.choices[0].message.content or ""), schemas[custom_id.split("-")[0]])
    for custom_id, body in responses_ok.items():
        response = Response.model_validate(body)
        if custom_id == "logprobs":
            part = response.output[0].content[0]  # type: ignore[union-attr]
            assert part.logprobs and len(part.logprobs) == 3 and len(part.logprobs[0].top_logprobs) == 2  # type: ignore[union-attr]
            continue
        assert response.status == "completed"
        jsonschema.validate(json.loads(response.output_text), schemas[custom_id.split("-")[0]])
    for failed in (chat_failed, responses_failed):
        assert list(failed) == ["unique"]
        error = failed["unique"]["error"]
        assert error["code"] == "invalid_json_schema" and "uniqueItems" in error["message"]
    assert chat_failed["unique"]["error"]["param"] == "response_format"
    assert raw_prompt["raw"]["error"]["code"] == "unsupported_parameter" and "thinks before it answers" in str(
        raw_prompt
    )
    assert responses_failed["unique"]["error"]["param"] == "text.format"

    deadline = time.monotonic() + 240
    while anthropic_client.messages.batches.retrieve(message_batch.id).processing_status != "ended":
        assert time.monotonic() < deadline
        time.sleep(0.2)
    results = {entry.custom_id: entry.result for entry in anthropic_client.messages.batches.results(message_batch.id)}
    for custom_id, result in results.items():
        if custom_id == "unique":
            assert result.type == "errored" and "output_config.format" in result.error.error.message  # type: ignore[union-attr]
            continue
        assert result.type == "succeeded"
        message = Message.model_validate(result.message.model_dump())  # type: ignore[union-attr]
        if custom_id == "fields":
            assert message.stop_reason == "max_tokens" and message.usage.output_tokens == 4
            continue
        assert message.stop_reason == "end_turn" and message.content[0].type == "text"
        jsonschema.validate(json.loads(message.content[0].text), schemas[custom_id.split("-")[0]])
    print(
        f"moderations and formats: {time.monotonic() - started:.1f} s for {len(chat_lines) + len(responses_lines) + len(moderation_lines) + len(requests)} lines"
    )
