"""OpenAI's current batch fields end to end on the embedded default registry (no BACKFILL_MODELS): the
official SDK, the real API, the in-process worker and the real vLLM engines of the default's models.

What a newcomer's first `make run` serves: `/v1/embeddings` works out of the box (and `dimensions` on the Matryoshka
demo model, as on text-embedding-3), `/v1/responses` batches come back as Response objects, an over-long
`max_tokens` is a 400 line, and `usage` counts what the prefix cache served.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import openai
import pytest
from openai.types import Batch, CreateEmbeddingResponse
from openai.types.chat import ChatCompletion
from openai.types.responses import Response

from storage.registry import DEFAULT_EMBEDDING_MODEL, DEMO_EMBEDDING_MODEL
from tests.conftest import LiveServer, configure, make_key, start_server
from tests.integration.api.helpers import read_lines, to_jsonl, upload, wait_for

pytestmark = pytest.mark.vllm
MATRYOSHKA = DEMO_EMBEDDING_MODEL


@pytest.fixture(scope="module")
def live(
    demo_model_path: Path,
    demo_vl_model_path: Path,
    demo_moderation_model_path: Path,
    demo_embedding_model_path: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[LiveServer]:
    """`backfill serve` as a newcomer runs it: nothing configured but the data folder (the demo model is built)."""
    from worker.cli.migrate import migrate_database
    from worker.process import service

    data = tmp_path_factory.mktemp("default-registry")
    (data / "models").mkdir()
    (data / "models" / "backfill-demo").symlink_to(demo_model_path)
    (data / "models" / "backfill-demo-vl").symlink_to(demo_vl_model_path)
    (data / "models" / "backfill-demo-moderation").symlink_to(demo_moderation_model_path)
    (data / "models" / "backfill-demo-embed").symlink_to(demo_embedding_model_path)
    service.close_engines()  # engines are cached per model name: other modules' specs must not leak in
    with pytest.MonkeyPatch.context() as patch:
        configure(patch, {"BACKFILL_DATA_DIR": str(data), "BACKFILL_REAP_INTERVAL_SECONDS": "1"})
        migrate_database()
        server, stop = start_server(with_worker=True)
        try:
            yield server
        finally:
            stop()
            service.close_engines()


@pytest.fixture(scope="module")
def client(live: LiveServer) -> openai.OpenAI:
    return live.client(make_key("newcomer"))


def run(client: openai.OpenAI, lines: list[dict[str, Any]], endpoint: str) -> Batch:
    source = upload(client, to_jsonl(lines))
    assert source.expires_at == source.created_at + 30 * 86400  # purpose=batch: 30 days by default
    batch = client.batches.create(input_file_id=source.id, endpoint=endpoint, completion_window="24h")  # type: ignore[arg-type]
    return wait_for(client, batch.id, timeout=300)


def line(custom_id: str, url: str, **body: Any) -> dict[str, Any]:
    return {"custom_id": custom_id, "method": "POST", "url": url, "body": body}


def test_the_default_registry_serves_a_chat_and_an_embedding_model(client: openai.OpenAI) -> None:
    served = {model.id for model in client.models.list()}
    assert {
        "backfill-demo",
        "backfill-demo-vl",
        DEFAULT_EMBEDDING_MODEL,
        MATRYOSHKA,
        "backfill-demo-moderation",
    } <= served


def test_an_embeddings_batch_runs_on_the_embedded_default(client: openai.OpenAI) -> None:
    texts = ["a cat sat on the mat", "a kitten sat on the rug", "quarterly tax filing deadline"]
    lines = [line(f"e{i}", "/v1/embeddings", model=DEFAULT_EMBEDDING_MODEL, input=t) for i, t in enumerate(texts)]
    done = run(client, lines, "/v1/embeddings")
    assert done.status == "completed" and done.request_counts and done.request_counts.completed == 3
    vectors = {}
    for output in read_lines(client, done.output_file_id):
        parsed = CreateEmbeddingResponse.model_validate(output["response"]["body"])
        vectors[output["custom_id"]] = parsed.data[0].embedding
        assert len(parsed.data[0].embedding) == 384 and parsed.model == DEFAULT_EMBEDDING_MODEL
    cosine = [sum(a * b for a, b in zip(vectors["e0"], vectors[k], strict=True)) for k in ("e1", "e2")]
    assert cosine[0] > cosine[1]  # a real model: cats are closer to kittens than to taxes
    assert done.usage and done.usage.input_tokens > 0 and done.usage.output_tokens == 0


def test_dimensions_on_a_model_that_cannot_shorten_its_vectors_answer_as_openai_does_for_ada_002(
    client: openai.OpenAI,
) -> None:
    """Issue 37: the error line named the model by the server's file system path."""
    lines = [
        line("short", "/v1/embeddings", model=DEFAULT_EMBEDDING_MODEL, input="hi", dimensions=64),
        line("native", "/v1/embeddings", model=DEFAULT_EMBEDDING_MODEL, input="hi", dimensions=384),
    ]
    done = run(client, lines, "/v1/embeddings")
    (error,) = read_lines(client, done.error_file_id)
    assert error["custom_id"] == "short" and error["response"]["status_code"] == 400
    envelope = error["response"]["body"]["error"]
    assert envelope["message"].startswith("This model does not support specifying dimensions")
    assert DEFAULT_EMBEDDING_MODEL in envelope["message"] and "/" not in envelope["message"]
    assert envelope["param"] == "dimensions"
    (output,) = read_lines(client, done.output_file_id)
    assert len(CreateEmbeddingResponse.model_validate(output["response"]["body"]).data[0].embedding) == 384


def test_dimensions_on_the_matryoshka_demo_model_shorten_its_vectors_as_text_embedding_3_does(
    client: openai.OpenAI,
) -> None:
    """Issue 37: text-embedding-3 lines asking `dimensions` had no model here that could honour it."""
    lines = [
        line("full", "/v1/embeddings", model=MATRYOSHKA, input="The sky is blue."),
        line("d512", "/v1/embeddings", model=MATRYOSHKA, input=["The sky is blue.", "Grass is green."], dimensions=512),
        line("d1", "/v1/embeddings", model=MATRYOSHKA, input="The sky is blue.", dimensions=1),
        line("wide", "/v1/embeddings", model=MATRYOSHKA, input="The sky is blue.", dimensions=2000),
    ]
    done = run(client, lines, "/v1/embeddings")
    answers = {
        o["custom_id"]: CreateEmbeddingResponse.model_validate(o["response"]["body"])
        for o in read_lines(client, done.output_file_id)
    }
    vectors = {custom_id: [d.embedding for d in answer.data] for custom_id, answer in answers.items()}
    assert [len(v) for v in vectors["full"] + vectors["d512"] + vectors["d1"]] == [1536, 512, 512, 1]
    assert all(math.isclose(math.hypot(*v), 1.0, rel_tol=1e-3) for v in vectors["full"] + vectors["d512"])
    head = vectors["full"][0][:512]  # its first 512 dimensions, renormalised
    norm = math.hypot(*head)
    assert all(math.isclose(x / norm, y, abs_tol=1e-4) for x, y in zip(head, vectors["d512"][0], strict=True))
    assert len(vectors["d1"][0]) == 1 and math.isclose(vectors["d1"][0][0], math.copysign(1.0, head[0]), rel_tol=1e-3)
    (error,) = read_lines(client, done.error_file_id)
    assert error["custom_id"] == "wide" and error["response"]["status_code"] == 400
    envelope = error["response"]["body"]["error"]
    assert (envelope["code"], envelope["param"]) == ("invalid_value", "dimensions")
    assert envelope["message"] == f"Model {MATRYOSHKA!r} only supports dimensions in range [1, 1536], got 2000."


def test_an_endpoint_its_model_cannot_serve_is_refused_at_create(client: openai.OpenAI) -> None:
    source = upload(client, to_jsonl([line("x", "/v1/embeddings", model="backfill-demo", input="hi")]))
    with pytest.raises(openai.BadRequestError) as refused:
        client.batches.create(input_file_id=source.id, endpoint="/v1/embeddings", completion_window="24h")
    assert refused.value.code == "unsupported_endpoint" and DEFAULT_EMBEDDING_MODEL in refused.value.message


def test_a_responses_batch_comes_back_as_response_objects(client: openai.OpenAI) -> None:
    lines = [
        line(
            f"r{i}", "/v1/responses", model="backfill-demo", input=f"def f{i}():", max_output_tokens=8, ignore_eos=True
        )
        for i in range(4)
    ]
    lines.append(
        line("sys", "/v1/responses", model="backfill-demo", instructions="Be brief.", input="hi", max_output_tokens=3)
    )
    done = run(client, lines, "/v1/responses")
    assert done.status == "completed" and done.request_counts and done.request_counts.completed == 5
    outputs = read_lines(client, done.output_file_id)
    responses = {o["custom_id"]: Response.model_validate(o["response"]["body"]) for o in outputs}
    for custom_id in ("r0", "r1", "r2", "r3"):
        response = responses[custom_id]
        assert response.object == "response" and response.model == "backfill-demo"
        assert response.output[0].type == "message" and response.output[0].content[0].type == "output_text"
        assert response.usage and response.usage.output_tokens == 8
    assert responses["sys"].instructions == "Be brief."
    assert done.usage and done.usage.output_tokens == sum(r.usage.output_tokens for r in responses.values() if r.usage)


def test_an_over_long_max_tokens_is_a_400_error_line_and_not_billed(client: openai.OpenAI) -> None:
    messages = [{"role": "user", "content": "hi"}]
    lines = [
        line("huge", "/v1/chat/completions", model="backfill-demo", messages=messages, max_tokens=10_000_000),
        line("ok", "/v1/chat/completions", model="backfill-demo", messages=messages, max_tokens=4, ignore_eos=True),
    ]
    done = run(client, lines, "/v1/chat/completions")
    assert done.status == "completed" and done.request_counts
    assert (done.request_counts.completed, done.request_counts.failed) == (1, 1)
    (error,) = read_lines(client, done.error_file_id)
    assert error["custom_id"] == "huge" and error["response"]["status_code"] == 400
    envelope = openai.types.ErrorObject.model_validate(error["response"]["body"]["error"])
    assert envelope.code == "context_length_exceeded" and envelope.param == "max_tokens"
    assert envelope.message.startswith("This model's maximum context length is 32768 tokens. However, you requested")
    assert done.usage and done.usage.output_tokens == 4
    assert client.batches.retrieve(done.id).model_extra["cost"]["output_tokens"] == 4  # type: ignore[index]


def test_a_repeated_system_prompt_shows_as_cached_tokens_in_usage_and_the_cost_block(client: openai.OpenAI) -> None:
    system = {"role": "system", "content": "You review Python code and answer in one line. " * 12}

    def lines(tag: str) -> list[dict[str, Any]]:
        return [
            line(
                f"{tag}{i}",
                "/v1/chat/completions",
                model="backfill-demo",
                messages=[system, {"role": "user", "content": f"def g{i}(): return {i}"}],
                max_tokens=2,
            )
            for i in range(4)
        ]

    run(client, lines("warm"), "/v1/chat/completions")  # fills the engine's prefix cache
    done = run(client, lines("hit"), "/v1/chat/completions")
    bodies = [ChatCompletion.model_validate(o["response"]["body"]) for o in read_lines(client, done.output_file_id)]
    cached = sum(
        b.usage.prompt_tokens_details.cached_tokens or 0 for b in bodies if b.usage and b.usage.prompt_tokens_details
    )
    assert done.usage and done.usage.input_tokens_details.cached_tokens == cached > 0
    assert cached <= done.usage.input_tokens
    cost = client.batches.retrieve(done.id).model_extra["cost"]  # type: ignore[index]
    assert cost["cached_input_tokens"] == cached and Decimal(cost["cached_input_usd_per_mtok"]) == Decimal("0.3")
