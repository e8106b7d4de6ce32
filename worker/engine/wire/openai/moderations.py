"""OpenAI moderations: text and images in, one `Moderation` result per input out, scored by a classification model.

A classifier (a registry entry with `"runner": "pooling", "convert": "classify"`) scores each input once; its
labels that are OpenAI's category names fill `category_scores` (a category the model lacks scores 0), a category
is flagged at a score of FLAG_THRESHOLD or more, and the result is flagged if any category is. An array of
strings is that many inputs and results; an array of `{"type": "text"}` / `{"type": "image_url"}` objects is one
input, as at OpenAI: text parts only, their text joined; with images, one user turn of those parts in order (the
images fetched and decoded as a chat's are, worker/engine/media.py, and the model must take images), and each
category's `category_applied_input_types` names the input types it was applied to (`image` only for the
categories OpenAI scores images for).
"""

from __future__ import annotations

import uuid
from typing import Annotated, Any, Literal

from pydantic import Field, field_validator

from worker.engine import EngineResult
from worker.engine.generation import Generation, Output
from worker.engine.wire.base import BodyError, Reply, Strict
from worker.engine.wire.openai.answers import ok

# OpenAI's categories (openai.types.Moderation), in the order its answers list them, and those it also scores
# images for (the rest apply to text only).
CATEGORIES = (
    "harassment",
    "harassment/threatening",
    "hate",
    "hate/threatening",
    "illicit",
    "illicit/violent",
    "self-harm",
    "self-harm/intent",
    "self-harm/instructions",
    "sexual",
    "sexual/minors",
    "violence",
    "violence/graphic",
)
IMAGE_CATEGORIES = frozenset(
    {"self-harm", "self-harm/intent", "self-harm/instructions", "sexual", "violence", "violence/graphic"}
)
FLAG_THRESHOLD = 0.5
MAX_INPUTS = 2048  # strings in one line's `input`: each is one pass of the classifier


class TextInput(Strict):
    type: Literal["text"]
    text: str


class ImageURL(Strict):
    url: str = Field(max_length=20 * 2**20)


class ImageInput(Strict):
    type: Literal["image_url"]
    image_url: ImageURL


MultiModalInput = Annotated[TextInput | ImageInput, Field(discriminator="type")]


class ModerationBody(Strict):
    input: list[MultiModalInput] | list[str] | str  # errors name the parts first: they are the likelier typo
    model: str | None = None  # None: the registry's moderation model (BACKFILL_MODERATION_MODEL) ran it

    @field_validator("input", mode="before")
    @classmethod
    def _one_shape(cls, value: Any) -> Any:
        """Name the accepted shapes plainly, instead of pydantic's union-of-everything message."""
        shaped = isinstance(value, str) or (
            isinstance(value, list)
            and (
                all(isinstance(item, str) for item in value)
                or all(isinstance(item, dict) and item.get("type") in ("text", "image_url") for item in value)
            )
        )
        if not shaped:
            raise ValueError(
                "must be a string, an array of strings, or an array of {'type': 'text'} and {'type': 'image_url'} "
                "objects"
            )
        return value

    def texts(self) -> list[str]:
        """One text per result: the string, each string of a list, or a list of text parts' text joined."""
        if isinstance(self.input, str):
            return [self.input]
        if not self.input:
            raise BodyError("input must not be empty", code="invalid_value", param="input")
        if len(self.input) > MAX_INPUTS:
            raise BodyError(f"input holds at most {MAX_INPUTS} strings", code="invalid_value", param="input")
        if all(isinstance(item, str) for item in self.input):
            return [str(item) for item in self.input]
        return ["\n".join(part.text for part in self.input if isinstance(part, TextInput))]

    def input_types(self) -> tuple[str, ...]:
        """The kinds of input each result was computed from: text, and image when the parts hold images."""
        if isinstance(self.input, str) or not any(isinstance(part, ImageInput) for part in self.input):
            return ("text",)
        texts = any(isinstance(part, TextInput) for part in self.input)
        return ("text", "image") if texts else ("image",)

    def generation(self) -> Generation:
        """One classification per input; an input with images as one user turn of its parts (chat-style)."""
        texts = self.texts()
        if self.input_types() == ("text",):
            return Generation(kind="classify", inputs=tuple(texts))
        parts = [part.model_dump(exclude_none=True) for part in self.input if not isinstance(part, str)]
        return Generation(kind="classify", messages=({"role": "user", "content": parts},))


def moderation_reply(body: ModerationBody) -> Reply:
    """A `ModerationCreateResponse`: one result per input, in input order."""

    def reply(output: Output, model: str) -> EngineResult:
        answer = {
            "id": f"modr-{output.response_id or uuid.uuid4().hex}",
            "model": model,
            "results": [moderation_result(scores, body.input_types()) for scores in output.scores],
        }
        return ok(output, answer, completion=False)

    return reply


def moderation_result(scores: dict[str, float], input_types: tuple[str, ...] = ("text",)) -> dict[str, Any]:
    """OpenAI's `Moderation` for one input's label probabilities (labels that are not its categories ignored)."""
    category_scores = {category: float(scores.get(category, 0.0)) for category in CATEGORIES}
    categories = {category: score >= FLAG_THRESHOLD for category, score in category_scores.items()}
    applied = {
        category: [kind for kind in input_types if kind == "text" or category in IMAGE_CATEGORIES]
        for category in CATEGORIES
    }
    return {
        "flagged": any(categories.values()),
        "categories": categories,
        "category_scores": category_scores,
        "category_applied_input_types": applied,
    }
