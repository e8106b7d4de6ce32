"""The checks a create asks for, each bounded (storage/batches/checks.py)."""

from __future__ import annotations

from typing import Any

import pytest

from storage.batches.checks import checks_spec
from storage.errors import InvalidValue

CHAT = "/v1/chat/completions"


def test_checks_take_their_defaults_and_keep_what_was_asked() -> None:
    assert checks_spec({}, endpoint=CHAT) == {"schema": True, "max_attempts": 3}
    spec = checks_spec(
        {"schema": False, "regex": "a|b", "enum": ["a"], "max_length": 5, "max_attempts": 5,
         "json_schema": {"type": "object"}},
        endpoint="/v1/messages",
    )  # fmt: skip
    assert spec == {
        "schema": False,
        "regex": "a|b",
        "enum": ["a"],
        "max_length": 5,
        "max_attempts": 5,
        "json_schema": {"type": "object"},
    }


@pytest.mark.parametrize(
    ("raw", "param"),
    [
        ({"max_attempts": 0}, "checks.max_attempts"),
        ({"max_attempts": 6}, "checks.max_attempts"),
        ({"regex": "x" * 1001}, "checks.regex"),
        ({"regex": "[a"}, "checks.regex"),
        ({"enum": ["a"] * 257}, "checks.enum"),
        ({"enum": [1]}, "checks.enum"),
        ({"max_length": 10**7}, "checks.max_length"),
        ({"json_schema": {"type": "nope"}}, "checks.json_schema"),
        ({"json_schema": {"enum": ["x" * 70_000]}}, "checks.json_schema"),
        ({"schema": "yes"}, "checks.schema"),
        ({"retries": 2}, "checks"),
        ("regex", "checks"),
    ],
)
def test_a_check_out_of_bounds_is_refused_naming_its_field(raw: Any, param: str) -> None:
    with pytest.raises(InvalidValue) as refused:
        checks_spec(raw, endpoint=CHAT)
    assert refused.value.param == param


def test_checks_apply_only_to_endpoints_that_generate_text() -> None:
    with pytest.raises(InvalidValue) as refused:
        checks_spec({}, endpoint="/v1/embeddings")
    assert refused.value.param == "checks"


@pytest.mark.parametrize(
    "schema", [{"$schema": []}, {"$schema": 5}, {"type": "object", "maximum": 10**5000}, {"$ref": 7}]
)
def test_a_hostile_json_schema_is_a_400_never_a_crash(schema: dict[str, Any]) -> None:
    with pytest.raises(InvalidValue) as refused:
        checks_spec({"json_schema": schema}, endpoint=CHAT)
    assert refused.value.param == "checks.json_schema"
