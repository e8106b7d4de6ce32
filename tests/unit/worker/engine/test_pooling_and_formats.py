"""The engines on moderations, embeddings `dimensions` and structured output: the fake classifier and embedder (what
the API tests run on), and the shared-mode HTTP engine's side (what it refuses, how a server's error reads)."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import pytest
from openai.types import CreateEmbeddingResponse, ModerationCreateResponse
from openai.types.chat import ChatCompletion

from worker.engine import EngineRequest, EngineResult
from worker.engine.fake import EMBEDDING_DIMENSIONS, FakeEngine
from worker.engine.generation import BodyError, Generation
from worker.engine.http_wire import refusal, server_request


def run(engine: FakeEngine, url: str, body: dict[str, Any]) -> EngineResult:
    refused = engine.add(EngineRequest("r1", url, body))
    if refused is not None:
        return refused
    while True:
        for result in engine.step():
            return result


def test_the_fake_classifier_answers_moderations_and_nothing_else() -> None:
    classifier = FakeEngine("clf", runner="pooling", task="classify")
    result = run(classifier, "/v1/moderations", {"input": ["one", "two words"]})
    answer = ModerationCreateResponse.model_validate(result.body)
    assert len(answer.results) == 2 and answer.model == "clf" and result.prompt_tokens == 3
    again = ModerationCreateResponse.model_validate(run(classifier, "/v1/moderations", {"input": "one"}).body)
    assert again.results[0] == answer.results[0]  # the same input scores the same
    embedding = run(classifier, "/v1/embeddings", {"input": "x"})
    assert embedding.status_code == 400 and embedding.body["error"]["code"] == "unsupported_endpoint"
    embedder = FakeEngine("emb", runner="pooling")
    refused = run(embedder, "/v1/moderations", {"input": "x"})
    assert refused.status_code == 400 and "does not serve /v1/moderations" in refused.body["error"]["message"]


def test_the_fake_embedder_shortens_to_the_dimensions_asked_and_refuses_more() -> None:
    embedder = FakeEngine("emb", runner="pooling")
    short = CreateEmbeddingResponse.model_validate(
        run(embedder, "/v1/embeddings", {"input": "x", "dimensions": 3}).body
    )
    assert len(short.data[0].embedding) == 3
    assert sum(value * value for value in short.data[0].embedding) == pytest.approx(1.0)
    too_many = run(embedder, "/v1/embeddings", {"input": "x", "dimensions": EMBEDDING_DIMENSIONS + 1})
    assert too_many.status_code == 400 and too_many.body["error"]["param"] == "dimensions"


def test_the_fake_answers_structured_output_with_json_its_schema_accepts() -> None:
    schema = {
        "type": "object",
        "$defs": {
            "Tag": {"type": "object", "properties": {"name": {"type": "string", "minLength": 2}}, "required": ["name"]}
        },
        "properties": {"tag": {"$ref": "#/$defs/Tag"}, "score": {"type": ["integer", "null"], "minimum": 3}},
        "required": ["tag", "score"],
        "additionalProperties": False,
    }
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": "x"}],
        "response_format": {"type": "json_schema", "json_schema": {"name": "t", "schema": schema}},
    }
    answer = ChatCompletion.model_validate(run(FakeEngine(), "/v1/chat/completions", body).body)
    jsonschema.validate(json.loads(answer.choices[0].message.content or ""), schema)
    assert answer.choices[0].finish_reason == "stop"


def test_shared_mode_refuses_moderations_with_a_reason() -> None:
    with pytest.raises(BodyError, match="moderations do not run on a shared vLLM server"):
        server_request(Generation(kind="classify", inputs=("x",)))


def test_a_servers_error_names_the_model_as_the_registry_does_never_its_path() -> None:
    """Issue 37: an embeddings line with `dimensions` answered with the server's file system path of the model."""
    path = "/srv/models/all-MiniLM-L6-v2"
    message = (
        f"Model {path!r} does not support Matryoshka embeddings; dimensions must be unset (received dimensions=8)."
    )
    body = {"error": {"message": message, "type": "BadRequestError", "param": None, "code": 400}}
    result = refusal("r1", 400, body, names=(path, "minilm"))
    assert path not in json.dumps(result.body) and path not in (result.error_message or "")
    assert "'minilm' does not support Matryoshka" in result.body["error"]["message"]
