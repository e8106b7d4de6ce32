"""The fake engine with images and documents: the real media resolver off its thread, FAKE_IMAGE_TOKENS a picture,
a failed image failing its own line only, a slow image server holding no other line."""

from __future__ import annotations

import ipaddress
import time
from collections.abc import Iterator
from typing import Any

import pytest
from anthropic.types import Message
from openai.types import ModerationCreateResponse
from openai.types.chat import ChatCompletion

from tests.media_server import MediaServer, data_url, png_bytes, tiny_pdf
from worker.engine import EngineRequest, EngineResult
from worker.engine.fake import FAKE_IMAGE_TOKENS, FakeEngine
from worker.engine.media import MediaLimits, MediaResolver, media_policy
from worker.engine.media_waits import MediaWaits

PNG = data_url(png_bytes())


@pytest.fixture(scope="module")
def server() -> Iterator[MediaServer]:
    found = MediaServer()
    yield found
    found.close()


@pytest.fixture
def engine() -> Iterator[FakeEngine]:
    limits = MediaLimits(
        fetch_timeout_seconds=3, policy=media_policy(allowed_networks=(ipaddress.ip_network("127.0.0.1/32"),))
    )
    found = FakeEngine(max_num_seqs=4, media=MediaWaits(lambda: MediaResolver(limits)))
    yield found
    found.close()


def chat(rid: str, *parts: Any, max_tokens: int = 3) -> EngineRequest:
    content = [{"type": "text", "text": "two words"}, *parts]
    body = {"model": "fake-model", "max_tokens": max_tokens, "messages": [{"role": "user", "content": content}]}
    return EngineRequest(rid, "/v1/chat/completions", body)


def image(url: str) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": url}}


def drain(engine: FakeEngine, timeout: float = 20) -> dict[str, EngineResult]:
    done: dict[str, EngineResult] = {}
    deadline = time.monotonic() + timeout
    while engine.has_unfinished() and time.monotonic() < deadline:
        done.update((r.request_id, r) for r in engine.step())
    return done


def test_each_image_counts_a_fixed_number_of_prompt_tokens(engine: FakeEngine) -> None:
    assert engine.add(chat("text")) is None and engine.add(chat("one", image(PNG))) is None
    assert engine.add(chat("two", image(PNG), image(PNG))) is None
    done = drain(engine)
    base = done["text"].prompt_tokens
    assert done["one"].prompt_tokens == base + FAKE_IMAGE_TOKENS
    assert done["two"].prompt_tokens == base + 2 * FAKE_IMAGE_TOKENS
    answer = ChatCompletion.model_validate(done["two"].body)
    assert answer.usage is not None and answer.usage.prompt_tokens == base + 2 * FAKE_IMAGE_TOKENS


def test_a_document_counts_as_its_text(engine: FakeEngine) -> None:
    pdf = {"type": "file", "file": {"file_data": data_url(tiny_pdf(["one two three four"]), "application/pdf")}}
    engine.add(chat("doc", pdf))
    engine.add(chat("text"))
    done = drain(engine)
    assert done["doc"].ok and done["doc"].prompt_tokens > done["text"].prompt_tokens + 4


def test_an_image_that_fails_fails_only_its_line(engine: FakeEngine, server: MediaServer) -> None:
    engine.add(chat("private", image("http://10.9.9.9/cat.png")))
    engine.add(chat("broken", image("data:image/png;base64,AAAA")))
    engine.add(chat("fine", image(server.url + "/red.png")))
    engine.add(chat("text"))
    done = drain(engine)
    assert (done["private"].status_code, done["private"].error_code) == (400, "image_fetch_failed")
    assert (
        done["private"].body["error"]["code"] == "image_fetch_failed"
        and "10.9.9.9" in done["private"].body["error"]["message"]
    )
    assert done["broken"].error_code == "invalid_image"
    assert done["fine"].ok and done["text"].ok


def test_a_slow_image_server_holds_up_no_other_line(engine: FakeEngine, server: MediaServer) -> None:
    engine.add(chat("slow", image(server.url + "/slow.png")))
    for i in range(3):
        engine.add(chat(f"t{i}", image(PNG) if i else {"type": "text", "text": "x"}))
    started, done = time.monotonic(), {}
    while len(done) < 3:
        done.update((r.request_id, r) for r in engine.step())
    assert time.monotonic() - started < 2.0 and "slow" not in done  # the others finished while it trickled
    rest = drain(engine)
    assert rest["slow"].error_code == "image_fetch_failed" and "3 s" in rest["slow"].error_message


def test_an_aborted_line_waiting_for_its_image_gives_no_result(engine: FakeEngine, server: MediaServer) -> None:
    engine.add(chat("slow", image(server.url + "/slow.png")))
    assert engine.has_unfinished() and engine.stats().waiting == 0
    engine.abort(["slow"])
    assert not engine.has_unfinished() and engine.step() == []


def test_an_anthropic_image_request_is_answered_as_a_message(engine: FakeEngine) -> None:
    block = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG.split(",")[1]}}
    body = {
        "model": "fake-model",
        "max_tokens": 2,
        "messages": [{"role": "user", "content": [block, {"type": "text", "text": "hi"}]}],
    }
    engine.add(EngineRequest("a", "/v1/messages", body))
    message = Message.model_validate(drain(engine)["a"].body)
    assert message.usage.input_tokens > FAKE_IMAGE_TOKENS


def test_a_moderation_input_with_images_is_classified_once_and_its_image_failures_name_the_input() -> None:
    limits = MediaLimits(policy=media_policy(allowed_networks=(ipaddress.ip_network("127.0.0.1/32"),)))
    engine = FakeEngine(runner="pooling", task="classify", media=MediaWaits(lambda: MediaResolver(limits)))
    try:
        text = {"type": "text", "text": "two words"}
        bodies = {
            "text": {"input": [text]},
            "both": {"input": [text, image(PNG)]},
            "broken": {"input": [text, image("data:image/png;base64,AAAA")]},
        }
        for rid, body in bodies.items():
            assert engine.add(EngineRequest(rid, "/v1/moderations", body)) is None
        done = drain(engine)
    finally:
        engine.close()
    answer = ModerationCreateResponse.model_validate(done["both"].body)
    assert len(answer.results) == 1 and answer.results[0].category_applied_input_types.violence == ["text", "image"]
    assert done["both"].prompt_tokens == 2 + 2 + FAKE_IMAGE_TOKENS and done["text"].ok  # words, turn, image
    assert (done["broken"].error_code, done["broken"].body["error"]["param"]) == ("invalid_image", "input")
