"""Checked answers (a Backfill extension, docs/workflow.md): what every answer of a batch must pass, checked and
bounded at create. The worker checks each answer and draws a failing one again (worker/feed/checks.py).

Checks: `schema` (default true: the line's own `response_format` / tool schema / `output_config`), `json_schema`
(the answer's text is JSON this schema accepts), `regex` (the whole text matches), `enum` (the text, stripped, is
one of these), `max_length` (characters); `max_attempts` (1..5, default 3) answers at most per line.
"""

from __future__ import annotations

import contextlib
import json
import re
from typing import Any

from jsonschema.exceptions import SchemaError
from jsonschema.validators import validator_for

from storage.endpoints import CHAT_URL, COMPLETIONS_URL, MESSAGES_URL, RESPONSES_URL
from storage.errors import InvalidValue
from storage.models import Batch

MAX_ATTEMPTS = 5
DEFAULT_ATTEMPTS = 3
MAX_REGEX_CHARS = 1000
MAX_ENUM_VALUES = 256
MAX_VALUE_CHARS = 1000
MAX_SCHEMA_BYTES = 64 * 1024
MAX_LENGTH = 1_000_000
CHECKED_ENDPOINTS = frozenset({CHAT_URL, COMPLETIONS_URL, RESPONSES_URL, MESSAGES_URL})  # those that generate text
_KEYS = frozenset({"schema", "json_schema", "regex", "enum", "max_length", "max_attempts"})


def checks_spec(raw: Any, *, endpoint: str) -> dict[str, Any]:
    """The checks a create asked for, each bounded (InvalidValue naming the field otherwise), with defaults."""
    if not isinstance(raw, dict):
        raise InvalidValue('checks must be an object, e.g. {"regex": "yes|no", "max_attempts": 3}.', param="checks")
    if unknown := sorted(set(raw) - _KEYS):
        raise InvalidValue(
            f"Unknown checks field '{unknown[0][:64]}'; known: {', '.join(sorted(_KEYS))}.", param="checks"
        )
    if endpoint not in CHECKED_ENDPOINTS:
        raise InvalidValue(f"checks apply to endpoints that generate text, not {endpoint}.", param="checks")
    spec: dict[str, Any] = {"schema": _flag(raw.get("schema", True)), "max_attempts": _attempts(raw)}
    if "json_schema" in raw:
        spec["json_schema"] = _schema(raw["json_schema"])
    if "regex" in raw:
        spec["regex"] = _regex(raw["regex"])
    if "enum" in raw:
        spec["enum"] = _enum(raw["enum"])
    if "max_length" in raw:
        value = raw["max_length"]
        if not _is_int(value) or not 1 <= value <= MAX_LENGTH:
            raise InvalidValue(
                f"checks.max_length must be an integer from 1 to {MAX_LENGTH}.", param="checks.max_length"
            )
        spec["max_length"] = value
    return spec


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _flag(value: Any) -> bool:
    if not isinstance(value, bool):
        raise InvalidValue("checks.schema must be true or false.", param="checks.schema")
    return value


def _attempts(raw: dict[str, Any]) -> int:
    value = raw.get("max_attempts", DEFAULT_ATTEMPTS)
    if not _is_int(value) or not 1 <= value <= MAX_ATTEMPTS:
        raise InvalidValue(
            f"checks.max_attempts must be an integer from 1 to {MAX_ATTEMPTS}.", param="checks.max_attempts"
        )
    return int(value)


def _schema(value: Any) -> dict[str, Any]:
    size = MAX_SCHEMA_BYTES + 1
    if isinstance(value, dict):
        with contextlib.suppress(TypeError, ValueError):  # past what JSON can say back (a 4,300-digit integer)
            size = len(json.dumps(value))
    if not isinstance(value, dict) or size > MAX_SCHEMA_BYTES:
        raise InvalidValue(f"checks.json_schema must be a JSON schema object of at most {MAX_SCHEMA_BYTES} bytes.",
                           param="checks.json_schema")  # fmt: skip
    try:
        validator_for(value).check_schema(value)
    except SchemaError as error:
        raise InvalidValue(
            f"checks.json_schema is not a valid JSON schema: {error.message[:200]}", param="checks.json_schema"
        ) from None
    except Exception as error:  # what a hostile schema makes the validator raise ("$schema": [], ...): still a 400
        raise InvalidValue(
            f"checks.json_schema cannot be used: {type(error).__name__}.", param="checks.json_schema"
        ) from None
    return value


def _regex(value: Any) -> str:
    if not isinstance(value, str) or not 1 <= len(value) <= MAX_REGEX_CHARS:
        raise InvalidValue(f"checks.regex must be a string of 1 to {MAX_REGEX_CHARS} characters.", param="checks.regex")
    try:
        re.compile(value)
    except (re.error, OverflowError, RecursionError, ValueError) as error:
        raise InvalidValue(f"checks.regex does not compile: {error}.", param="checks.regex") from None
    return value


def _enum(value: Any) -> list[str]:
    if (
        not isinstance(value, list)
        or not 1 <= len(value) <= MAX_ENUM_VALUES
        or not all(isinstance(item, str) and len(item) <= MAX_VALUE_CHARS for item in value)
    ):
        raise InvalidValue(f"checks.enum must be a list of 1 to {MAX_ENUM_VALUES} strings of at most "
                           f"{MAX_VALUE_CHARS} characters.", param="checks.enum")  # fmt: skip
    return list(value)


def attach_workflow(batch: Batch, *, trial: dict[str, Any] | None, checks: dict[str, Any] | None) -> None:
    """A new batch's trial and checks, as create checked them (trials.trial_spec, checks_spec)."""
    if trial is not None:
        batch.trial = trial
    if checks is not None:
        batch.checks = checks
