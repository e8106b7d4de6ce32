"""What every wire format shares: the per-request body error, the strict base model, a parsed line.

Parsing is strict on purpose: a batch runs unattended, so a field we would silently ignore (`tools`,
`stream: true`, a typo) becomes a 400 on that one line instead of a surprising answer.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict

from worker.engine import EngineResult, error_result
from worker.engine.generation import BodyError, Generation, Output

__all__ = ["CUT_KEY", "TYPE_TAGS", "BodyError", "Parsed", "Reply", "Strict", "server_error"]

# The answer object's Backfill extension key: `{"cut_by": "expiry"}` on an answer its batch's expiry cut short.
CUT_KEY = "backfill"

Reply = Callable[[Output, str], EngineResult]  # (an engine's output, the served model's name) -> the line's answer


@dataclass(frozen=True)
class Parsed:
    """A batch line as its wire module read it: what the engine runs, and how its output becomes the answer."""

    generation: Generation
    reply: Reply

    def answer(self, output: Output, model: str) -> EngineResult:
        """The line's result: the answer in its protocol's shape (or the engine's error), with the run's time and
        the checkpoint a hand-back would keep."""
        result = output.error if output.error is not None else self.reply(output, model)
        result.engine_seconds = output.engine_seconds
        if result.ok:
            result.token_ids = list(output.checkpoint)
            if output.cut_by is not None:  # a Backfill extension on the answer object (the SDKs keep it, unknown)
                result.body[CUT_KEY] = {"cut_by": output.cut_by}
        return result


# Union members add their type name to a validation error's `loc` ("prompt.str"); messages name the field path.
TYPE_TAGS = {"str", "int", "float", "bool", "dict", "list", "function-after"}


def server_error(request_id: str, message: str) -> EngineResult:
    """A 500 for one request whose sequence failed inside the engine."""
    result = error_result(request_id, 500, message, code="engine_error")
    result.body["error"]["type"] = "server_error"
    return result


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
