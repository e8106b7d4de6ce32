"""The one place the API picks a protocol's words for a path: its error envelope (and that envelope's schema in the
OpenAPI document), its answer to a bug, and the dependency that reads its API key.

A path under a dialect's prefix speaks that dialect; every other path speaks OpenAI's. A third protocol adds one
entry here (and its routes in app.py); api/errors.py, api/limits.py and api/fair_share.py read this table.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from fastapi.dependencies.models import Dependant
from fastapi.responses import JSONResponse
from pydantic import BaseModel

from api import deps
from api.anthropic import deps as anthropic_deps
from api.anthropic import errors as anthropic_errors
from api.openai import errors as openai_errors


@dataclass(frozen=True)
class Dialect:
    """One protocol's words on its paths."""

    prefix: str  # its paths: this one and those under it ("": every path no other dialect claims)
    # (status, message, *, type_, code, param=None, headers=None) -> the error in this dialect's body
    envelope: Callable[..., JSONResponse]
    schema: type[BaseModel]  # the envelope's body, named in the OpenAPI document by its class name
    internal_error: str  # the message of a 500 (a bug)
    principal: Callable[..., Any]  # the dependency that reads its API key (a route with it answers 401 and 429)

    def owns(self, path: str) -> bool:
        """True for a path of this dialect."""
        return not self.prefix or path == self.prefix or path.startswith(self.prefix + "/")


def _anthropic_envelope(
    status: int, message: str, *, headers: Mapping[str, str] | None = None, **_openai_fields: Any
) -> JSONResponse:
    # Anthropic's body has no code or param: its type follows from the status.
    return anthropic_errors.envelope(status, message, headers=dict(headers) if headers else None)


OPENAI = Dialect(
    prefix="",
    envelope=openai_errors.envelope,
    schema=openai_errors.ErrorResponse,
    internal_error="The server had an error processing your request.",
    principal=deps.principal_dependency,
)
# Most specific first: the first dialect that owns a path speaks there; OpenAI's owns every path, so it is last.
DIALECTS = (
    Dialect(
        prefix=anthropic_errors.PREFIX,
        envelope=_anthropic_envelope,
        schema=anthropic_errors.AnthropicErrorResponse,
        internal_error="Internal server error.",
        principal=anthropic_deps.principal_dependency,
    ),
    OPENAI,
)


def dialect_of(path: str) -> Dialect:
    """The dialect a path speaks (a trailing slash ignored)."""
    path = path.rstrip("/") or "/"
    return next(dialect for dialect in DIALECTS if dialect.owns(path))


def requires_key(dependant: Dependant) -> bool:
    """Whether a route depends (at any depth) on some dialect's API key."""
    principals = {dialect.principal for dialect in DIALECTS}
    stack: list[Dependant] = [dependant]
    while stack:
        current = stack.pop()
        if current.call in principals:
            return True
        stack.extend(current.dependencies)
    return False
