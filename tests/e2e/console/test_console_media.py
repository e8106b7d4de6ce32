"""The console's batch page shows what issue 37's lines carry: the images and documents a batch's lines sent (a data
URL drawn as a thumbnail, a remote URL named and never loaded by the browser: the worker fetches it under its
network rules), and the answers' tool calls and folded reasoning, for an OpenAI batch and an Anthropic message batch.

On the fake engine (`fake:` models with a tool-call and a reasoning parser): what is judged here is the page; the
real engine's tool calls, reasoning and images are proved in tests/e2e/api/.
"""

from __future__ import annotations

import base64
import io
import json
from collections.abc import Iterator
from pathlib import Path

import anthropic
import pytest

from tests.conftest import LiveServer, make_key, start_server
from tests.e2e.console.browser import CHROMIUM, FLAGS, WAIT_MS, sign_in
from tests.integration.api.helpers import to_jsonl, upload, wait_for

pytestmark = pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Debian's chromium: infra/local/services.sh")
playwright = pytest.importorskip("playwright.sync_api")
MODEL = "fake-chat"
REMOTE = "http://10.1.2.3/cat.png"  # a private address: the worker refuses to fetch it, the page must not load it
WEATHER = {
    "name": "get_weather",
    "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


def png() -> str:
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (8, 8), (200, 30, 30)).save(buffer, format="PNG")
    return base64.b64encode(buffer.getvalue()).decode()


@pytest.fixture
def live(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[LiveServer]:
    from tests.conftest import configure
    from worker.cli.migrate import migrate_database

    model = {
        "path": "fake:",
        "tool_parser": "hermes",
        "reasoning_parser": "deepseek_r1",
        "extra": {"step_seconds": 0.001},
    }
    configure(
        monkeypatch,
        {
            "BACKFILL_DATA_DIR": str(tmp_path / "data"),
            "BACKFILL_MODELS": json.dumps({MODEL: model}),
            "BACKFILL_REAP_INTERVAL_SECONDS": "1",
        },
    )
    migrate_database()
    server, stop = start_server(with_worker=True)
    yield server
    stop()


@pytest.fixture
def page(live: LiveServer) -> Iterator[playwright.Page]:
    with playwright.sync_playwright() as driver:
        browser = driver.chromium.launch(executable_path=str(CHROMIUM), args=FLAGS)
        context = browser.new_context(viewport={"width": 1280, "height": 900})
        tab = context.new_page()
        tab.set_default_timeout(WAIT_MS)
        problems: list[str] = []
        tab.on("pageerror", lambda error: problems.append(f"page error: {error}"))
        tab.on("console", lambda msg: problems.append(msg.text) if "Content Security Policy" in msg.text else None)
        tab.on(
            "request", lambda request: problems.append(f"loaded {request.url}") if "10.1.2.3" in request.url else None
        )
        tab.problems = problems  # type: ignore[attr-defined]
        yield tab
        context.close()
        browser.close()


def chat(custom_id: str, content: object, **extra: object) -> dict[str, object]:
    body = {"model": MODEL, "messages": [{"role": "user", "content": content}], "max_tokens": 8, **extra}
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions", "body": body}


def test_a_batch_page_shows_the_images_sent_and_the_tool_calls_and_reasoning_returned(
    live: LiveServer, page: playwright.Page
) -> None:
    expect = playwright.expect
    expect.set_options(timeout=WAIT_MS)
    key = make_key("acme")
    client = live.client(key)
    image = f"data:image/png;base64,{png()}"
    lines = [
        chat("img", [{"type": "text", "text": "What is this?"}, {"type": "image_url", "image_url": {"url": image}}]),
        chat("remote", [{"type": "text", "text": "And this?"}, {"type": "image_url", "image_url": {"url": REMOTE}}]),
        chat(
            "tool",
            "Weather in Paris?",
            tools=[{"type": "function", "function": WEATHER}],
            tool_choice={"type": "function", "function": {"name": "get_weather"}},
        ),
        chat("think", "Why is the sky blue?", reasoning_effort="high", max_tokens=12),
    ]
    source = upload(client, to_jsonl(lines))
    batch = client.batches.create(input_file_id=source.id, endpoint="/v1/chat/completions", completion_window="24h")
    done = wait_for(client, batch.id, timeout=120)
    assert (done.request_counts.completed, done.request_counts.failed) == (3, 1)  # the private URL is refused

    sign_in(page, live.base_url, key)
    page.goto(f"{live.base_url}/console#/batch/{batch.id}")
    expect(page.locator("#batch-status")).to_have_text("completed")
    sent = page.locator("#images-sent .line-media")
    expect(sent).to_have_count(2)
    expect(sent.nth(0).locator("code").first).to_have_text("img")
    thumb = sent.nth(0).locator("img.thumb")
    expect(thumb).to_have_count(1)
    page.wait_for_function("() => document.querySelector('#images-sent img.thumb').naturalWidth === 8")
    expect(sent.nth(1).locator("code.image-url")).to_have_text(REMOTE)
    expect(sent.nth(1).locator("img")).to_have_count(0)
    answers = page.locator("#results-answers .result-answer")
    expect(answers).to_have_count(2)
    expect(page.locator("#results-answers .tool-call")).to_contain_text('get_weather({"city"')
    expect(page.locator("#results-answers details.reasoning summary")).to_contain_text("Reasoning")

    # An Anthropic message batch: a base64 image block and a forced tool, its page the same.
    messages = anthropic.Anthropic(api_key=key, base_url=live.base_url, max_retries=0)
    block = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": png()}}
    params = {
        "model": MODEL,
        "max_tokens": 8,
        "messages": [{"role": "user", "content": [block, {"type": "text", "text": "Weather where this is?"}]}],
        "tools": [{"name": "get_weather", "description": "weather", "input_schema": WEATHER["parameters"]}],
        "tool_choice": {"type": "tool", "name": "get_weather"},
    }
    created = messages.messages.batches.create(requests=[{"custom_id": "a1", "params": params}])  # type: ignore[list-item]
    page.goto(f"{live.base_url}/console#/batch/{created.id}")
    expect(page.locator("#batch-status")).to_have_text("completed")
    expect(page.locator("#images-sent img.thumb")).to_have_count(1)
    expect(page.locator("#results-answers .tool-call")).to_contain_text("get_weather(")
    assert page.problems == []  # type: ignore[attr-defined]
