"""OpenAI embeddings: inputs in, one vector each out (floats or base64)."""

from __future__ import annotations

import base64
import sys
from array import array
from typing import Literal

from pydantic import Field

from worker.engine import EngineResult
from worker.engine.generation import Generation, Output
from worker.engine.wire.base import BodyError, Reply, Strict
from worker.engine.wire.openai.answers import ok


class EmbeddingBody(Strict):
    input: str | list[str] | list[int] | list[list[int]]
    model: str | None = None
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(default=None, ge=1)
    user: str | None = None

    def inputs(self) -> list[str | list[int]]:
        """One engine request per input: a string, or a list of token ids."""
        items: list[str | list[int]]
        if isinstance(self.input, str) or (self.input and isinstance(self.input[0], int)):
            items = [self.input]
        else:
            items = list(self.input)  # type: ignore[arg-type]
        if not items or any(len(item) == 0 for item in items):
            raise BodyError("input must not be empty", code="invalid_value", param="input")
        return items

    def generation(self) -> Generation:
        """One vector per input."""
        return Generation(kind="embed", inputs=tuple(self.inputs()), dimensions=self.dimensions)


def embedding_reply(body: EmbeddingBody) -> Reply:
    """An embeddings `list`; base64 is little-endian float32, as OpenAI's client expects."""

    def reply(output: Output, model: str) -> EngineResult:
        answer = {
            "object": "list",
            "data": [
                {"object": "embedding", "index": index, "embedding": _encode(vector, body.encoding_format)}
                for index, vector in enumerate(output.vectors)
            ],
            "model": model,
            "usage": {"prompt_tokens": output.prompt_tokens, "total_tokens": output.prompt_tokens},
        }
        return ok(output, answer, completion=False)

    return reply


def _encode(vector: list[float], encoding_format: str) -> list[float] | str:
    if encoding_format == "float":
        return vector
    packed = array("f", vector)
    if sys.byteorder == "big":
        packed.byteswap()
    return base64.b64encode(packed.tobytes()).decode("ascii")
