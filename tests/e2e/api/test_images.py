"""Images and documents end to end: the official `openai` and `anthropic` SDKs against the real API, the in-process
worker and the real vLLM engine on the vision-language demo model (`backfill-demo-vl`, Idefics3), one server per
backend (SQLite + a local folder, Postgres + S3).

Chat `image_url` (a data: URL, an http URL served on 127.0.0.1 and allowed by BACKFILL_MEDIA_ALLOWED_NETWORKS,
`detail: low`), a chat `file` (a PDF), Responses `input_image`, Anthropic `image` (base64 and url) and `document`
(PDF and plain text) blocks; image tokens in `usage`; a private address, a bomb and a 5,000-page PDF each fail
their own line with a clear code.
"""

from __future__ import annotations

import gc
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest
from anthropic.types import Message
from openai.types import Batch
from openai.types.chat import ChatCompletion
from openai.types.responses import Response

from tests.conftest import LiveServer, configure, make_key, start_server
from tests.integration.api.helpers import read_lines, to_jsonl, upload, wait_for
from tests.media_server import MediaServer, bomb_png, data_url, png_bytes, tiny_pdf
from worker.engine.demo_vl_model import IMAGE_PROMPT_TOKENS

pytestmark = pytest.mark.vllm

MODEL = "backfill-demo-vl"
# The demo model's template writes "<image>\n" per image; the processor expands <image> to IMAGE_PROMPT_TOKENS.
TOKENS_PER_IMAGE = IMAGE_PROMPT_TOKENS + 1
QUESTION = "What is in the picture?"


@pytest.fixture(scope="module")
def media_server() -> Iterator[MediaServer]:
    server = MediaServer()
    yield server
    server.close()


@pytest.fixture(scope="module", params=["embedded", "postgres"])
def live(
    request: pytest.FixtureRequest, demo_vl_model_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LiveServer]:
    """One real-engine server per backend, serving the vision-language demo model as the embedded default does."""
    from storage.registry import demo_vl_model
    from worker.cli.migrate import migrate_database
    from worker.process import service

    data = tmp_path_factory.mktemp(f"images-{request.param}")
    spec = demo_vl_model(data)[MODEL].model_dump(exclude_none=True) | {"path": str(demo_vl_model_path)}
    env = {
        "BACKFILL_DATA_DIR": str(data),
        "BACKFILL_MODELS": json.dumps({MODEL: spec}),
        "BACKFILL_MEDIA_ALLOWED_NETWORKS": "127.0.0.1/32",  # the test's image server; nothing else private
        "BACKFILL_REAP_INTERVAL_SECONDS": "1",
    }
    if request.param == "postgres":
        env["BACKFILL_DATABASE_URL"] = request.getfixturevalue("pg_url")
        env["BACKFILL_S3_ENDPOINT_URL"] = request.getfixturevalue("moto_endpoint")
        env["BACKFILL_S3_BUCKET"] = f"backfill-images-{int(time.time())}"
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
    return {"custom_id": custom_id, "method": "POST", "url": url, "body": {"model": MODEL, **body}}


def user(*parts: Any) -> list[dict[str, Any]]:
    return [{"role": "user", "content": [{"type": "text", "text": QUESTION}, *parts]}]


def image(url: str, detail: str = "auto") -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": url, "detail": detail}}


def run(client: openai.OpenAI, lines: list[dict[str, Any]], endpoint: str) -> tuple[Batch, dict[str, Any]]:
    source = upload(client, to_jsonl(lines))
    batch = client.batches.create(input_file_id=source.id, endpoint=endpoint, completion_window="24h")  # type: ignore[arg-type]
    done = wait_for(client, batch.id, timeout=180)
    found = read_lines(client, done.output_file_id) + read_lines(client, done.error_file_id)
    return done, {item["custom_id"]: item for item in found}


def test_chat_lines_with_images_and_a_pdf_count_image_tokens(live: LiveServer, media_server: MediaServer) -> None:
    client = live.client(make_key("vision"))
    png = data_url(png_bytes(640, 480))
    pdf = data_url(tiny_pdf(["Revenue grew nine percent"]), "application/pdf")
    lines = [
        line("text", "/v1/chat/completions", messages=user(), max_tokens=4),
        line("inline", "/v1/chat/completions", messages=user(image(png)), max_tokens=4),
        line(
            "remote", "/v1/chat/completions", messages=user(image(media_server.url + "/red.png", "low")), max_tokens=4
        ),
        line("two", "/v1/chat/completions", messages=user(image(png), image(png)), max_tokens=4),
        line(
            "pdf",
            "/v1/chat/completions",
            messages=user({"type": "file", "file": {"filename": "q3.pdf", "file_data": pdf}}),
            max_tokens=4,
        ),
        line("private", "/v1/chat/completions", messages=user(image("http://10.255.255.1/cat.png")), max_tokens=4),
        line("bomb", "/v1/chat/completions", messages=user(image(data_url(bomb_png(60000, 60000)))), max_tokens=4),
        line(
            "pages",
            "/v1/chat/completions",
            messages=user(
                {"type": "file", "file": {"file_data": data_url(tiny_pdf(blank_pages=5000), "application/pdf")}}
            ),
            max_tokens=4,
        ),
    ]
    done, results = run(client, lines, "/v1/chat/completions")
    assert done.status == "completed" and done.request_counts is not None
    assert (done.request_counts.completed, done.request_counts.failed) == (5, 3)

    answers = {
        cid: ChatCompletion.model_validate(results[cid]["response"]["body"])
        for cid in ("text", "inline", "remote", "two", "pdf")
    }
    prompt = {cid: answer.usage.prompt_tokens for cid, answer in answers.items() if answer.usage}
    assert prompt["inline"] == prompt["text"] + TOKENS_PER_IMAGE
    assert prompt["remote"] == prompt["text"] + TOKENS_PER_IMAGE
    assert prompt["two"] == prompt["text"] + 2 * TOKENS_PER_IMAGE
    assert prompt["pdf"] > prompt["text"] + 5  # the page's text, read by the model
    assert all(answer.model == MODEL and answer.choices[0].finish_reason == "length" for answer in answers.values())
    assert done.usage is not None and done.usage.input_tokens == sum(prompt.values())  # billed as input

    errors = {cid: results[cid]["response"]["body"]["error"] for cid in ("private", "bomb", "pages")}
    assert errors["private"]["code"] == "image_fetch_failed" and "private address" in errors["private"]["message"]
    assert errors["bomb"]["code"] == "image_too_large"
    assert errors["pages"]["code"] == "document_too_large" and "5000 pages" in errors["pages"]["message"]
    assert all(results[cid]["response"]["status_code"] == 400 for cid in errors)


def test_a_responses_line_with_input_image(live: LiveServer, media_server: MediaServer) -> None:
    client = live.client(make_key("vision-responses"))
    content = [
        {"type": "input_text", "text": QUESTION},
        {"type": "input_image", "image_url": media_server.url + "/red.png", "detail": "auto"},
    ]
    lines = [
        line("img", "/v1/responses", input=[{"role": "user", "content": content}], max_output_tokens=4),
        line("txt", "/v1/responses", input=[{"role": "user", "content": content[:1]}], max_output_tokens=4),
    ]
    done, results = run(client, lines, "/v1/responses")
    assert done.status == "completed" and done.request_counts is not None and done.request_counts.completed == 2
    img, txt = (Response.model_validate(results[cid]["response"]["body"]) for cid in ("img", "txt"))
    assert img.usage is not None and txt.usage is not None
    assert img.usage.input_tokens == txt.usage.input_tokens + TOKENS_PER_IMAGE
    assert img.status == "incomplete" and img.output[0].type == "message"


def test_anthropic_image_and_document_blocks(live: LiveServer, media_server: MediaServer) -> None:
    client = anthropic.Anthropic(
        api_key=make_key("vision-anthropic"), base_url=live.base_url, max_retries=0, timeout=120
    )
    png = png_bytes(300, 200)
    import base64

    b64 = base64.b64encode(png).decode()
    pdf = base64.b64encode(tiny_pdf(["Minutes of the meeting"])).decode()

    def req(custom_id: str, *blocks: Any) -> dict[str, Any]:
        content = [*blocks, {"type": "text", "text": QUESTION}]
        return {
            "custom_id": custom_id,
            "params": {"model": MODEL, "max_tokens": 3, "messages": [{"role": "user", "content": content}]},
        }

    batch = client.messages.batches.create(
        requests=[  # type: ignore[arg-type]
            req("text"),
            req("base64", {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64}}),
            req("url", {"type": "image", "source": {"type": "url", "url": media_server.url + "/red.png"}}),
            req(
                "pdf",
                {
                    "type": "document",
                    "source": {"type": "base64", "media_type": "application/pdf", "data": pdf},
                    "title": "Minutes",
                },
            ),
            req(
                "plain",
                {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "A short note."}},
            ),
            req(
                "metadata",
                {"type": "image", "source": {"type": "url", "url": "http://169.254.169.254/latest/meta-data"}},
            ),
        ]
    )
    deadline = time.time() + 180
    while client.messages.batches.retrieve(batch.id).processing_status != "ended":
        assert time.time() < deadline
        time.sleep(0.2)
    results = {item.custom_id: item.result for item in client.messages.batches.results(batch.id)}
    messages = {
        cid: Message.model_validate(result.message.model_dump())
        for cid, result in results.items()
        if result.type == "succeeded"
    }
    assert set(messages) == {"text", "base64", "url", "pdf", "plain"}
    tokens = {
        cid: message.usage.input_tokens + (message.usage.cache_read_input_tokens or 0)
        for cid, message in messages.items()
    }
    assert tokens["base64"] == tokens["url"] == tokens["text"] + TOKENS_PER_IMAGE
    assert tokens["pdf"] > tokens["text"] + 3 and tokens["plain"] > tokens["text"] + 3
    failed = results["metadata"]
    assert failed.type == "errored" and "cloud metadata" in failed.error.error.message  # type: ignore[union-attr]
