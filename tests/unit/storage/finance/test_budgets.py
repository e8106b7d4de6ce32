"""Spend-cap arithmetic: amounts parsed exactly into micro-dollars, calendar months, what is left."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal

import pytest

from storage.errors import InvalidRequest
from storage.finance.budgets import TenantBudget, month_start, usd, usd_text
from storage.strict import parse_usd


@pytest.mark.parametrize(("text", "micro"), [("12.50", 12_500_000), ("0", 0), ("0.000001", 1), ("1000", 10**9)])
def test_a_cap_written_as_a_decimal_string_is_kept_exactly(text: str, micro: int) -> None:
    assert parse_usd(text, param="max_cost_usd") == micro
    assert usd(micro) == Decimal(text)


@pytest.mark.parametrize("bad", ["", "abc", "-1", "NaN", "Infinity", "0.0000001", "1e13", " 3 ", 1.5, 3, None, [1]])
def test_a_cap_that_is_not_an_exact_dollar_amount_is_refused_naming_the_field(bad: object) -> None:
    with pytest.raises(InvalidRequest) as refused:
        parse_usd(bad, param="max_cost_usd")
    assert refused.value.param == "max_cost_usd" and refused.value.code == "invalid_value"


def test_the_month_starts_at_midnight_utc_on_the_first() -> None:
    at = int(datetime(2026, 12, 31, 23, 59, 59, tzinfo=UTC).timestamp())
    assert month_start(at) == int(datetime(2026, 12, 1, tzinfo=UTC).timestamp())
    assert month_start(month_start(at)) == month_start(at)


def test_what_is_left_never_goes_below_zero_and_renders_six_places() -> None:
    over = TenantBudget("t", Decimal("10"), Decimal("12.5"), 0)
    assert over.remaining_usd == Decimal(0)
    assert over.to_json()["remaining_usd"] == "0.000000" and over.to_json()["spent_usd"] == "12.500000"
    none = TenantBudget("t", None, Decimal("1"), 0)
    assert none.remaining_usd is None and none.to_json()["monthly_budget_usd"] is None
    assert usd_text(Decimal("0.1") + Decimal("0.2")) == "0.300000"
