"""Image lines through the API on the fake engine (FAKE_IMAGE_TOKENS a picture): what a batch of them comes back as,
a bad image failing only its line, the estimate counting images rather than their base64, the line limit named."""

from __future__ import annotations

import pytest
from openai.types.chat import ChatCompletion

from storage.planning.shapes import IMAGE_TOKENS_ESTIMATE
from tests.conftest import LiveServer, make_key
from tests.integration.api.conftest import FAKE_MODELS
from tests.integration.api.helpers import read_lines, to_jsonl, upload, wait_for
from tests.media_server import data_url, png_bytes
from worker.engine.fake import FAKE_IMAGE_TOKENS

LINE_MAX = 64 * 1024
pytestmark = pytest.mark.backfill_env({"BACKFILL_MODELS": FAKE_MODELS, "BACKFILL_LINE_MAX_BYTES": str(LINE_MAX)})


def image_line(custom_id: str, *urls: str) -> dict[str, object]:
    content = [{"type": "text", "text": "what is it"}, *({"type": "image_url", "image_url": {"url": u}} for u in urls)]
    body = {"model": "fake-model", "max_tokens": 2, "messages": [{"role": "user", "content": content}]}
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions", "body": body}


def test_a_batch_of_image_lines_bills_image_tokens_and_fails_bad_images_line_by_line(api: LiveServer) -> None:
    client = api.client(make_key("acme"))
    png = data_url(png_bytes(200, 100))
    lines = [
        image_line("text"),
        image_line("one", png),
        image_line("two", png, png),
        image_line("private", "http://192.168.1.20/cam.jpg"),
        image_line("junk", "data:image/png;base64,AAAA"),
    ]
    source = upload(client, to_jsonl(lines))
    body = {"input_file_id": source.id, "endpoint": "/v1/chat/completions", "completion_window": "24h"}
    estimate = client.post("/batches/estimate", body=body, cast_to=object)
    assert estimate["requests"] == 5
    assert 5 * IMAGE_TOKENS_ESTIMATE <= estimate["cost"]["input_tokens"] < 5 * IMAGE_TOKENS_ESTIMATE + 500  # 5 images
    batch = wait_for(client, client.batches.create(**body).id)  # type: ignore[arg-type]
    assert batch.status == "completed" and batch.request_counts is not None
    assert (batch.request_counts.completed, batch.request_counts.failed) == (3, 2)
    found = {
        item["custom_id"]: item
        for item in read_lines(client, batch.output_file_id) + read_lines(client, batch.error_file_id)
    }
    usage = {cid: ChatCompletion.model_validate(found[cid]["response"]["body"]).usage for cid in ("text", "one", "two")}
    assert usage["one"] and usage["text"] and usage["two"]
    assert usage["one"].prompt_tokens == usage["text"].prompt_tokens + FAKE_IMAGE_TOKENS
    assert usage["two"].prompt_tokens == usage["text"].prompt_tokens + 2 * FAKE_IMAGE_TOKENS
    private = found["private"]["response"]
    assert private["status_code"] == 400 and private["body"]["error"]["code"] == "image_fetch_failed"
    assert (
        "192.168.1.20" in private["body"]["error"]["message"]
        and "BACKFILL_MEDIA_ALLOWED_NETWORKS" in private["body"]["error"]["message"]
    )
    assert found["junk"]["response"]["body"]["error"]["code"] == "invalid_image"
    assert batch.usage is not None and batch.usage.input_tokens == sum(u.prompt_tokens for u in usage.values() if u)


def test_an_inline_image_past_the_line_limit_fails_validation_naming_the_setting(api: LiveServer) -> None:
    client = api.client(make_key("acme"))
    big = data_url(png_bytes(600, 600) + b"\0" * LINE_MAX)
    source = upload(client, to_jsonl([image_line("big", big)]))
    batch = wait_for(
        client,
        client.batches.create(input_file_id=source.id, endpoint="/v1/chat/completions", completion_window="24h").id,
    )
    assert batch.status == "failed" and batch.errors and batch.errors.data
    error = batch.errors.data[0]
    assert error.code == "line_too_large" and "BACKFILL_LINE_MAX_BYTES" in (error.message or "")
