"""Images and documents on the wire: chat `image_url` / `file` parts, Responses `input_image` / `input_file`,
Anthropic `image` / `document` blocks, each read into the neutral parts a Generation carries (or refused by name)."""

from __future__ import annotations

from typing import Any

import pytest

from storage.planning.shapes import IMAGE_TOKENS_ESTIMATE, request_size
from worker.engine.wire import parse
from worker.engine.wire.base import BodyError

PNG = "data:image/png;base64,iVBORw0KGgo="
CHAT, RESPONSES, MESSAGES = "/v1/chat/completions", "/v1/responses", "/v1/messages"


def chat(*parts: Any, role: str = "user") -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": role, "content": list(parts)}]}


def refused(url: str, body: dict[str, Any]) -> BodyError:
    with pytest.raises(BodyError) as failed:
        parse(url, body)
    return failed.value


def test_chat_image_url_and_file_parts_become_neutral_parts() -> None:
    body = chat(
        {"type": "text", "text": "Compare these."},
        {"type": "image_url", "image_url": {"url": PNG, "detail": "low"}},
        {"type": "image_url", "image_url": {"url": "https://example.com/cat.jpg"}},
        {"type": "file", "file": {"filename": "a.pdf", "file_data": "data:application/pdf;base64,JVBERi0="}},
        {"type": "file", "file": {"filename": "b.pdf", "file_data": "JVBERi0="}},  # bare base64
    )
    generation = parse(CHAT, body).generation
    content = generation.messages[0]["content"]
    assert content[0] == {"type": "text", "text": "Compare these."}
    assert content[1] == {"type": "image_url", "image_url": {"url": PNG, "detail": "low"}}
    assert content[2]["image_url"] == {"url": "https://example.com/cat.jpg", "detail": "auto"}
    assert content[3]["document"] == {"url": "data:application/pdf;base64,JVBERi0=", "title": "a.pdf", "context": None}
    assert content[4]["document"]["url"] == "data:application/pdf;base64,JVBERi0="
    assert generation.needs_media() and generation.restart_reason() == "images"
    assert generation.plain_turns() is None  # rendered by vLLM's renderer, with the images


def test_text_only_parts_still_render_as_one_string() -> None:
    generation = parse(CHAT, chat({"type": "text", "text": "a"}, {"type": "text", "text": "b"})).generation
    assert generation.messages[0]["content"] == "a\nb" and not generation.needs_media()


@pytest.mark.parametrize(
    ("part", "role", "words"),
    [
        ({"type": "image_url", "image_url": {"url": PNG}}, "system", "only allowed in messages with role 'user'"),
        ({"type": "input_audio", "input_audio": {"data": "AA", "format": "wav"}}, "user", "audio input"),
        ({"type": "file", "file": {"file_id": "file-abc"}}, "user", "file_id is not supported"),
        ({"type": "image_url", "image_url": {"url": PNG, "detail": "ultra"}}, "user", "detail"),
        ({"type": "image_url", "image_url": {"url": PNG}, "extra": 1}, "user", "unsupported field 'extra'"),
        ({"type": "video_url", "video_url": {"url": "x"}}, "user", "unsupported content part type 'video_url'"),
    ],
)
def test_chat_parts_that_cannot_run_are_refused_by_name(part: dict[str, Any], role: str, words: str) -> None:
    failed = refused(CHAT, chat(part, role=role))
    assert failed.code == "invalid_value" and words in failed.message and failed.param == "messages"


def test_responses_input_image_and_input_file_run_on_the_chat_path() -> None:
    body = {
        "model": "m",
        "instructions": "Be brief.",
        "input": [
            {
                "role": "user",
                "content": [
                    {"type": "input_text", "text": "What is in the image and the file?"},
                    {"type": "input_image", "image_url": PNG, "detail": "high"},
                    {"type": "input_file", "file_url": "https://example.com/report.pdf"},
                    {"type": "input_file", "filename": "x.pdf", "file_data": "data:application/pdf;base64,JVBERi0="},
                ],
            }
        ],
    }
    messages = parse(RESPONSES, body).generation.messages
    assert messages[0] == {"role": "system", "content": "Be brief."}
    content = messages[1]["content"]
    assert content[1]["image_url"] == {"url": PNG, "detail": "high"}
    assert content[2]["document"]["url"] == "https://example.com/report.pdf"
    assert content[3]["document"]["title"] == "x.pdf"
    no_url = refused(
        RESPONSES, {"model": "m", "input": [{"role": "user", "content": [{"type": "input_image", "detail": "auto"}]}]}
    )
    assert "needs an image_url" in no_url.message
    file_id = {"type": "input_image", "file_id": "file-1", "detail": "auto"}
    assert "file_id" in refused(RESPONSES, {"model": "m", "input": [{"role": "user", "content": [file_id]}]}).message


def test_anthropic_image_and_document_blocks_become_neutral_parts() -> None:
    blocks = [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}},
        {
            "type": "image",
            "source": {"type": "url", "url": "https://example.com/cat.jpg"},
            "cache_control": {"type": "ephemeral"},
        },
        {
            "type": "document",
            "source": {"type": "base64", "media_type": "application/pdf", "data": "JVBERi0="},
            "title": "Q3",
            "citations": {"enabled": True},
        },
        {"type": "document", "source": {"type": "url", "url": "https://example.com/a.pdf"}},
        {
            "type": "document",
            "source": {"type": "text", "media_type": "text/plain", "data": "Plain words."},
            "title": "Note",
            "context": "From HR",
        },
        {"type": "text", "text": "Summarise."},
    ]
    body = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": blocks}]}
    content = parse(MESSAGES, body).generation.messages[0]["content"]
    assert content[0]["image_url"]["url"] == PNG
    assert content[1]["image_url"]["url"] == "https://example.com/cat.jpg"
    assert content[2]["document"] == {"url": "data:application/pdf;base64,JVBERi0=", "title": "Q3", "context": None}
    assert content[3]["document"]["url"] == "https://example.com/a.pdf"
    assert content[4]["type"] == "text" and "Plain words." in content[4]["text"] and "From HR" in content[4]["text"]
    assert content[5] == {"type": "text", "text": "Summarise."}


@pytest.mark.parametrize(
    ("block", "words"),
    [
        ({"type": "image", "source": {"type": "file", "file_id": "file_1"}}, "'file' source is not supported"),
        ({"type": "image", "source": {"type": "base64", "media_type": "image/bmp", "data": "AA"}}, "media_type"),
        ({"type": "document", "source": {"type": "base64", "media_type": "image/png", "data": "AA"}}, "media_type"),
    ],
)
def test_anthropic_blocks_that_cannot_run_are_refused(block: dict[str, Any], words: str) -> None:
    body = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": [block]}]}
    failed = refused(MESSAGES, body)
    assert failed.code == "invalid_value" and words in failed.message


def test_the_planner_counts_an_image_not_its_base64() -> None:
    inline = "data:image/png;base64," + "A" * 400_000
    body = chat({"type": "text", "text": "hi"}, {"type": "image_url", "image_url": {"url": inline}})
    tokens, _ = request_size(CHAT, body, line_bytes=400_200)
    assert IMAGE_TOKENS_ESTIMATE <= tokens < IMAGE_TOKENS_ESTIMATE + 100
    anthropic = {
        "messages": [{"role": "user", "content": [{"type": "image", "source": {"type": "base64", "data": "A" * 8000}}]}]
    }
    assert request_size(MESSAGES, anthropic, line_bytes=8100)[0] < IMAGE_TOKENS_ESTIMATE + 100
    text_only = request_size(CHAT, chat({"type": "text", "text": "hi"}), line_bytes=4000)[0]
    assert text_only == 1000  # bytes / 4, as before
