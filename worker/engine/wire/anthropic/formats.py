"""Anthropic's structured output: `output_config.format` (and the beta's `output_format` before it), a JSON schema
the answer's text must match, enforced by the engine's structured outputs so it always parses against it."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from worker.engine.generation import Constraint
from worker.engine.wire.base import BodyError, Strict


class JsonOutputFormat(Strict):
    """`{"type": "json_schema", "schema": {...}}` (anthropic.types.JSONOutputFormatParam)."""

    type: Literal["json_schema"]
    schema_: dict[str, Any] = Field(alias="schema")


class OutputConfig(Strict):
    """`output_config` (anthropic.types.OutputConfigParam): the answer's format, and `effort`: how much the model
    spends, which this server's models take as the reasoning effort their chat template renders when they think
    (with `thinking` adaptive or enabled; otherwise accepted with no effect, as on a model that always spends what it
    needs)."""

    format: JsonOutputFormat | None = None
    effort: Literal["low", "medium", "high", "xhigh", "max"] | None = None


def constraint_of(
    config: OutputConfig | None, beta: JsonOutputFormat | None, *, prefill: bool = False
) -> Constraint | None:
    """The answer's required shape, from `output_config.format` or the beta's top-level `output_format` (not with a
    prefilled answer: the JSON is the whole answer, from its first token)."""
    found = config.format if config is not None else None
    if found is not None and beta is not None:
        raise BodyError(
            "output_format: send either output_config.format or the beta's output_format, not both",
            code="invalid_value",
            param="output_format",
        )
    constraint = None
    if found is not None:
        constraint = Constraint(json_schema=found.schema_, param="output_config.format")
    elif beta is not None:
        constraint = Constraint(json_schema=beta.schema_, param="output_format")
    if constraint is not None and prefill:
        raise BodyError(
            f"{constraint.param}: a prefilled answer (a final assistant turn) cannot be held to a JSON schema, which "
            "shapes the whole answer: drop the assistant turn",
            code="invalid_value",
            param=constraint.param,
        )
    return constraint
