"""What OpenAI's generating endpoints share: sampling fields, stop sequences, logit bias, `response_format`."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, PrivateAttr, field_validator, model_validator

from worker.engine.generation import Constraint, Sampling
from worker.engine.wire.base import BodyError, Strict

MAX_CHOICES = 16  # `n`; each choice is a whole sequence in the engine
MAX_STOP_SEQUENCES = 4


class JsonSchemaFormat(Strict):
    name: str
    schema_: dict[str, Any] = Field(default_factory=dict, alias="schema")
    description: str | None = None
    strict: bool | None = None


class ResponseFormat(Strict):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    @model_validator(mode="after")
    def _schema_given(self) -> ResponseFormat:
        if self.type == "json_schema" and self.json_schema is None:
            raise ValueError("a response_format of type 'json_schema' needs 'json_schema'")
        return self


class SamplingBody(Strict):
    """The fields every generating endpoint (chat, completions) takes."""

    model: str | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    n: int = Field(default=1, ge=1, le=MAX_CHOICES)
    stop: str | list[str] | None = Field(default=None)
    seed: int | None = None
    presence_penalty: float | None = Field(default=None, ge=-2, le=2)
    frequency_penalty: float | None = Field(default=None, ge=-2, le=2)
    logit_bias: dict[str, float] | None = None
    response_format: ResponseFormat | None = None
    ignore_eos: bool = False  # vLLM extension
    min_tokens: int = Field(default=0, ge=0)  # vLLM extension
    user: str | None = None
    _format_field: str = PrivateAttr(default="response_format")  # "text.format" when a Responses body runs as this

    @field_validator("stop")
    @classmethod
    def _few_stops(cls, value: str | list[str] | None) -> str | list[str] | None:
        if isinstance(value, list) and len(value) > MAX_STOP_SEQUENCES:
            raise ValueError(f"at most {MAX_STOP_SEQUENCES} stop sequences")
        return value

    def output_limit(self) -> int | None:
        """The requested output cap, or None for 'up to the context length'."""
        return self.max_tokens

    def requested_output(self) -> tuple[int, str] | None:
        """The output cap the body asked for explicitly, with the name of its field (None: not asked)."""
        return None if self.max_tokens is None else (self.max_tokens, "max_tokens")

    def stop_list(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])

    def logprob_count(self) -> int | None:
        """How many logprobs per token the engine must return (None: none)."""
        return None

    def sampling(self) -> Sampling:
        """How to sample, in the engine's neutral terms."""
        bias = None
        if self.logit_bias:
            try:
                bias = {int(token): value for token, value in self.logit_bias.items()}
            except ValueError:
                raise BodyError(
                    "logit_bias keys must be token ids (integers)", code="invalid_value", param="logit_bias"
                ) from None
        return Sampling(
            n=self.n,
            temperature=self.temperature,
            top_p=self.top_p,
            seed=self.seed,
            presence_penalty=self.presence_penalty,
            frequency_penalty=self.frequency_penalty,
            logit_bias=bias,
            min_tokens=self.min_tokens,
            ignore_eos=self.ignore_eos,
            stop=tuple(self.stop_list()),
            logprobs=self.logprob_count(),
        )

    def constraint(self) -> Constraint | None:
        """The answer's required shape (`response_format`), if any: enforced with the engine's structured outputs,
        so the answer parses against the schema (`$defs`/`$ref`, nullable unions, `additionalProperties` and the
        rest of what real files carry; a schema the engine cannot enforce fails the line, naming the field)."""
        fmt = self.response_format
        if fmt is None or fmt.type == "text":
            return None
        if fmt.type == "json_schema" and fmt.json_schema is not None:
            return Constraint(json_schema=fmt.json_schema.schema_, param=self._format_field)
        return Constraint(json_object=True, param=self._format_field)
