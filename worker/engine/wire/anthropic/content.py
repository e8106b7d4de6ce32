"""Anthropic's image and document blocks, as the neutral parts a `Generation` carries (generation.py).

`image` blocks with a `base64` source (JPEG, PNG, GIF, WEBP) or a `url` source; `document` blocks with a base64 or
`url` PDF, plain text (`text` source) or content blocks (`content` source), with their `title` and `context`. A
`file` source (the Files API) is refused: no file store is served here. A PDF's text is what the model reads
(worker/engine/media.py extracts it, page by page, on a thread and in a child process of its own); a document's
`citations` are accepted and none are answered. `cache_control` is accepted and ignored, as on text blocks.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator

from worker.engine.media import document_block
from worker.engine.wire.base import Strict
from worker.engine.wire.openai.content import URL_MAX_CHARS, document_part, image_part

IMAGE_MEDIA_TYPES = ("image/jpeg", "image/png", "image/gif", "image/webp")


def _no_file(value: Any) -> Any:
    if isinstance(value, dict) and value.get("type") == "file":
        raise ValueError("a 'file' source is not supported here (no Files API); send the data as base64 or a url")
    return value


class _Base64Image(Strict):
    type: Literal["base64"]
    media_type: Literal["image/jpeg", "image/png", "image/gif", "image/webp"]
    data: str = Field(min_length=1, max_length=URL_MAX_CHARS)


class _Url(Strict):
    type: Literal["url"]
    url: str = Field(min_length=1, max_length=URL_MAX_CHARS)


class ImageBlock(Strict):
    type: Literal["image"]
    source: _Base64Image | _Url
    cache_control: dict[str, Any] | None = None

    @field_validator("source", mode="before")
    @classmethod
    def _source(cls, value: Any) -> Any:
        return _no_file(value)

    def part(self) -> dict[str, Any]:
        """The neutral image part."""
        if isinstance(self.source, _Url):
            return image_part(self.source.url)
        return image_part(f"data:{self.source.media_type};base64,{self.source.data}")


class _Base64Pdf(Strict):
    type: Literal["base64"]
    media_type: Literal["application/pdf"]
    data: str = Field(min_length=1, max_length=URL_MAX_CHARS)


class _PlainText(Strict):
    type: Literal["text"]
    media_type: Literal["text/plain"]
    data: str


class _ContentText(Strict):
    type: Literal["text"]
    text: str
    cache_control: dict[str, Any] | None = None


class _Contents(Strict):
    type: Literal["content"]
    content: str | list[_ContentText | ImageBlock]


class _Citations(Strict):
    enabled: bool = False


class DocumentBlock(Strict):
    type: Literal["document"]
    source: _Base64Pdf | _Url | _PlainText | _Contents
    title: str | None = Field(default=None, max_length=500)
    context: str | None = None
    citations: _Citations | None = None  # accepted; answers carry no citations
    cache_control: dict[str, Any] | None = None

    @field_validator("source", mode="before")
    @classmethod
    def _source(cls, value: Any) -> Any:
        return _no_file(value)

    def parts(self) -> list[dict[str, Any]]:
        """The neutral parts: a PDF stays a document part (its text is extracted later), text becomes text."""
        source = self.source
        if isinstance(source, _Base64Pdf):
            return [document_part(f"data:application/pdf;base64,{source.data}", title=self.title, context=self.context)]
        if isinstance(source, _Url):
            return [document_part(source.url, title=self.title, context=self.context)]
        if isinstance(source, _PlainText):
            return [{"type": "text", "text": document_block([source.data], title=self.title, context=self.context)}]
        if isinstance(source.content, str):
            return [{"type": "text", "text": document_block([source.content], title=self.title, context=self.context)}]
        images = [block.part() for block in source.content if isinstance(block, ImageBlock)]
        texts = [block.text for block in source.content if isinstance(block, _ContentText)]
        text = document_block(["\n".join(texts)], title=self.title, context=self.context)
        return [{"type": "text", "text": text}, *images]


def user_content(blocks: list[Any]) -> str | list[dict[str, Any]] | None:
    """A user turn's text, image and document blocks as a chat message's content: the text joined when there is
    nothing else (every chat template takes that), else neutral parts; None when the turn has none of them."""
    parts: list[dict[str, Any]] = []
    for block in blocks:
        kind = getattr(block, "type", None)
        if kind == "text":
            parts.append({"type": "text", "text": block.text})
        elif isinstance(block, ImageBlock):
            parts.append(block.part())
        elif isinstance(block, DocumentBlock):
            parts.extend(block.parts())
    if not parts:
        return None
    if all(part["type"] == "text" for part in parts):
        return "\n".join(part["text"] for part in parts)
    return parts
