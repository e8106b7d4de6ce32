"""Strict parsing of money, priorities and result cursors (storage/strict.py, issue 36 §9): one rule each, one
error (`invalid_value`, naming the field) whether a schema field, a streamed body or the CLI parses the value."""

from __future__ import annotations

from decimal import Decimal

import pytest
from pydantic import BaseModel

from storage import lifecycle
from storage.errors import InvalidValue
from storage.protocols import ANTHROPIC, OPENAI
from storage.strict import Priority, UsdAmount, cursor_number, micro_usd, parse_usd, priority_value, usd_amount

# Each was taken as money before: signs, underscores, a leading '.', a trailing newline, other scripts' digits.
BAD_MONEY = ["1_000", "+5", ".5", "5.", "5\n", "\u0665", "\uff15", " 3", "1e3", "-0", "0x10", "NaN", "Infinity", ""]
BAD_MONEY += ["0.0000001", "1000000000000.000001", "1" * 30]


class Body(BaseModel):
    max_cost_usd: UsdAmount | None = None
    priority: Priority = 0


@pytest.mark.parametrize(
    ("text", "micro"), [("12.50", 12_500_000), ("0", 0), ("0.000001", 1), ("007", 7_000_000), ("1000000000000", 10**18)]
)
def test_money_is_ascii_digits_with_up_to_six_decimals_kept_exactly(text: str, micro: int) -> None:
    assert parse_usd(text, param="max_cost_usd") == micro == micro_usd(usd_amount(text, param="max_cost_usd"))
    assert Body(max_cost_usd=text).max_cost_usd == Decimal(text)  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", [*BAD_MONEY, 5, 0.5, True, None, [1], {"usd": "1"}])
def test_anything_else_is_refused_with_one_error_naming_the_field(bad: object) -> None:
    with pytest.raises(InvalidValue) as direct:
        parse_usd(bad, param="max_cost_usd")
    assert (direct.value.code, direct.value.param, direct.value.status) == ("invalid_value", "max_cost_usd", 400)
    if bad is not None:  # a schema field's null means "no cap"
        with pytest.raises(InvalidValue) as field:
            Body(max_cost_usd=bad)  # type: ignore[arg-type]
        assert field.value.message == direct.value.message and field.value.param == "max_cost_usd"


@pytest.mark.parametrize("good", [-100, 0, 7, 100])
def test_a_priority_is_an_integer_in_range(good: int) -> None:
    assert priority_value(good) == good == Body(priority=good).priority


@pytest.mark.parametrize("bad", [True, False, "7", 7.0, 101, -101, None, "\u0667", [7]])
def test_a_priority_that_is_not_a_json_integer_in_range_is_refused(bad: object) -> None:
    with pytest.raises(InvalidValue) as direct:
        priority_value(bad)
    with pytest.raises(InvalidValue) as field:
        Body(priority=bad)  # type: ignore[arg-type]
    assert field.value.message == direct.value.message and field.value.param == direct.value.param == "priority"


def test_a_cursor_is_its_prefix_and_ascii_digits() -> None:
    assert cursor_number("rs_0", prefix="rs_", param="after") == 0
    assert cursor_number("rs_" + "9" * 18, prefix="rs_", param="after") == 10**18 - 1
    for bad in ("rs_\u0663", "rs_\uff13", "rs_3\n", "rs_+3", "rs_ 3", "rs_-1", "rs_", "3", "RS_3", "rs_" + "1" * 19):
        with pytest.raises(InvalidValue) as refused:
            cursor_number(bad, prefix="rs_", param="after")
        assert refused.value.param == "after"


def test_the_schema_documents_the_rules() -> None:
    properties = Body.model_json_schema()["properties"]
    money = properties["max_cost_usd"]["anyOf"][0]
    assert money["type"] == "string" and money["pattern"] == r"^[0-9]{1,13}(\.[0-9]{1,6})?$"
    assert properties["priority"]["type"] == "integer" and properties["priority"]["maximum"] == 100


def test_every_batch_status_has_a_name_in_each_protocol() -> None:
    for status in lifecycle.ALLOWED:
        assert OPENAI.shown_status(status) == status
        assert ANTHROPIC.shown_status(status) in ("in_progress", "canceling", "ended")
    assert ANTHROPIC.shown_status(lifecycle.CANCELLED) == "ended" and ANTHROPIC.status_field == "processing_status"
