"""OpenAI's content parts, chat's and Responses', as the neutral parts a `Generation` carries (generation.py).

Chat: `text`, `image_url` (a data: URL or an http(s) URL, `detail`), `file` (a PDF as `file_data`, a base64 data:
URL or bare base64) and, in assistant messages passed back, `refusal`. Responses: `input_text`, `output_text`,
`input_image` (`image_url`, `detail`), `input_file` (`file_data` or `file_url`). Images go only in user messages,
as OpenAI has it. A `file_id` (a file uploaded to the Files API) is refused: only batch input files are stored
here. `input_audio` is refused: no audio model is served. Images and documents stay URLs here; the engine's
media resolver (worker/engine/media.py) fetches, checks and decodes them on a thread of its own.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, ValidationError

from worker.engine.generation import DOCUMENT_PART, IMAGE_PART
from worker.engine.wire.base import Strict

URL_MAX_CHARS = 64 * 1024 * 1024  # a data: URL is the image itself; the line's own size bounds it first
Detail = Literal["auto", "low", "high", "original"]


class _ImageUrl(Strict):
    url: str = Field(min_length=1, max_length=URL_MAX_CHARS)
    detail: Detail = "auto"


class _File(Strict):
    file_data: str | None = None
    file_id: str | None = None
    filename: str | None = Field(default=None, max_length=1024)


_CACHE = {"prompt_cache_breakpoint"}  # accepted and ignored: the engine's prefix cache needs no marks


def chat_parts(value: list[Any], *, role: str, neutral: bool = False) -> list[dict[str, Any]]:
    """A chat message's content parts as neutral parts; ValueError (the field validator's message) if one is bad.
    `neutral`: the parts of a Responses body run as chat, whose documents are neutral parts already."""
    parts = []
    for index, part in enumerate(value):
        kind = part.get("type") if isinstance(part, dict) else None
        fields = {k: v for k, v in part.items() if k not in _CACHE} if isinstance(part, dict) else {}
        if kind == DOCUMENT_PART and neutral:
            parts.append(part)
        elif kind == "text" and set(fields) == {"type", "text"} and isinstance(fields["text"], str):
            parts.append({"type": "text", "text": fields["text"]})
        elif kind == "refusal" and role == "assistant" and isinstance(fields.get("refusal"), str):
            parts.append({"type": "text", "text": fields["refusal"]})
        elif kind == "image_url":
            _user_only(role, index, "image_url")
            _only(fields, {"type", "image_url"}, index)
            image = _model(_ImageUrl, fields["image_url"], index, "image_url")
            parts.append(image_part(image.url, image.detail))
        elif kind == "file":
            _user_only(role, index, "file")
            _only(fields, {"type", "file"}, index)
            file = _model(_File, fields["file"], index, "file")
            parts.append(_file_part(file.file_data, file.file_id, None, file.filename, index))
        elif kind == "input_audio":
            raise ValueError(f"{index}: audio input is not supported: no audio model is served here")
        elif kind == "text":
            raise ValueError(f"{index}: a text part is {{'type': 'text', 'text': <string>}}")
        else:
            raise ValueError(f"{index}: unsupported content part type {kind!r} (text, image_url or file)")
    return parts


def responses_parts(value: list[Any], *, role: str) -> list[dict[str, Any]]:
    """A Responses message's content items as neutral parts; ValueError if one is bad."""
    parts = []
    for index, part in enumerate(value):
        kind = part.get("type") if isinstance(part, dict) else None
        fields = {k: v for k, v in part.items() if k not in _CACHE} if isinstance(part, dict) else {}
        if kind in ("input_text", "output_text") and isinstance(fields.get("text"), str):
            _only(fields, {"type", "text", "annotations", "logprobs"}, index)
            parts.append({"type": "text", "text": fields["text"]})
        elif kind == "refusal" and isinstance(fields.get("refusal"), str):
            parts.append({"type": "text", "text": fields["refusal"]})
        elif kind == "input_image":
            _user_only(role, index, "input_image")
            _only(fields, {"type", "image_url", "file_id", "detail"}, index)
            if fields.get("file_id") is not None:
                raise ValueError(f"{index}: file_id is not supported here; pass the image as image_url")
            url = fields.get("image_url")
            if not isinstance(url, str) or not url:
                raise ValueError(f"{index}: input_image needs an image_url (a data: URL or an http(s) URL)")
            detail = _model(_ImageUrl, {"url": url, "detail": fields.get("detail") or "auto"}, index, "input_image")
            parts.append(image_part(url, detail.detail))
        elif kind == "input_file":
            _user_only(role, index, "input_file")
            _only(fields, {"type", "file_data", "file_id", "file_url", "filename", "detail"}, index)
            url = fields.get("file_url")
            if url is not None and not isinstance(url, str):
                raise ValueError(f"{index}: file_url must be a string")
            parts.append(_file_part(fields.get("file_data"), fields.get("file_id"), url, fields.get("filename"), index))
        elif kind == "input_audio":
            raise ValueError(f"{index}: audio input is not supported: no audio model is served here")
        else:
            raise ValueError(
                f"{index}: unsupported content type {kind!r} (input_text, output_text, input_image or input_file)"
            )
    return parts


def image_part(url: str, detail: str = "auto") -> dict[str, Any]:
    """The neutral image part (generation.py)."""
    return {"type": IMAGE_PART, IMAGE_PART: {"url": url, "detail": detail}}


def document_part(url: str, *, title: str | None = None, context: str | None = None) -> dict[str, Any]:
    """The neutral document part (generation.py): a PDF at a data: or http(s) URL."""
    return {"type": DOCUMENT_PART, DOCUMENT_PART: {"url": url, "title": title, "context": context}}


def template_content(parts: list[dict[str, Any]]) -> str | list[dict[str, Any]]:
    """Parts as a message's content: the text joined when they are all text (every chat template takes that, and
    vLLM's direct path renders it), else the parts."""
    if all(part["type"] == "text" for part in parts):
        return "\n".join(part["text"] for part in parts)
    return parts


def _file_part(data: Any, file_id: Any, url: str | None, filename: Any, index: int) -> dict[str, Any]:
    if file_id is not None:
        raise ValueError(f"{index}: file_id is not supported here; pass the file itself as file_data")
    if url is not None and data is None:
        return document_part(url, title=filename if isinstance(filename, str) else None)
    if not isinstance(data, str) or not data:
        raise ValueError(f"{index}: a file needs file_data (a base64 PDF, or a data:application/pdf;base64 URL)")
    inline = data if data.startswith("data:") else f"data:application/pdf;base64,{data}"
    return document_part(inline, title=filename if isinstance(filename, str) else None)


def _user_only(role: str, index: int, kind: str) -> None:
    if role != "user":
        raise ValueError(f"{index}: {kind} content is only allowed in messages with role 'user', not {role!r}")


def _only(fields: dict[str, Any], allowed: set[str], index: int) -> None:
    extra = sorted(set(fields) - allowed)
    if extra:
        raise ValueError(f"{index}: unsupported field {extra[0]!r} in a {fields.get('type')} part")


def _model(model: type[Strict], value: Any, index: int, where: str) -> Any:
    try:
        return model.model_validate(value)
    except ValidationError as error:
        first = error.errors(include_url=False)[0]
        field = ".".join(str(p) for p in first["loc"])
        raise ValueError(f"{index}.{where}{'.' + field if field else ''}: {first['msg']}") from None
