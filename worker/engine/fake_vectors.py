"""The fake engine's pooling answers: hashed unit vectors (embeddings) and label probabilities (classification)."""

from __future__ import annotations

import hashlib
import math

from worker.engine.demo_moderation_model import MODERATION_CATEGORIES

EMBEDDING_DIMENSIONS = 8


def scores_of(item: str | list[int]) -> dict[str, float]:
    """The fake classifier's label probabilities: hashed from the input, in [0, 1)."""
    digest = hashlib.sha256(f"classify/{item}".encode()).digest()
    return {label: digest[index] / 256 for index, label in enumerate(MODERATION_CATEGORIES)}


def vector_of(item: str | list[int], dimensions: int | None = None) -> list[float]:
    digest = hashlib.sha256(str(item).encode()).digest()
    raw = [byte - 127.5 for byte in digest[: dimensions or EMBEDDING_DIMENSIONS]]
    norm = math.sqrt(sum(x * x for x in raw))
    return [x / norm for x in raw]
