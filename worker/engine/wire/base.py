"""What every wire format shares: the per-request body error and the strict base model.

Parsing is strict on purpose: a batch runs unattended, so a field we would silently ignore (`tools`,
`stream: true`, a typo) becomes a 400 on that one line instead of a surprising answer.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from worker.engine import EngineResult, error_result

# Union members add their type name to a validation error's `loc` ("prompt.str"); messages name the field path.
TYPE_TAGS = {"str", "int", "float", "bool", "dict", "list", "function-after"}


class BodyError(Exception):
    """A body that cannot run: it becomes one error result, never an exception out of `add()`."""

    def __init__(self, message: str, *, code: str, param: str | None = None, status_code: int = 400) -> None:
        super().__init__(message)
        self.message, self.code, self.param, self.status_code = message, code, param, status_code

    def to_result(self, request_id: str) -> EngineResult:
        return error_result(request_id, self.status_code, self.message, code=self.code, param=self.param)


def server_error(request_id: str, message: str) -> EngineResult:
    """A 500 for one request whose sequence failed inside the engine."""
    result = error_result(request_id, 500, message, code="engine_error")
    result.body["error"]["type"] = "server_error"
    return result


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
