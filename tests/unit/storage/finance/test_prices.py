"""The price book, a job's cost block, and splitting one run's busy time across its jobs."""

from __future__ import annotations

import json
from datetime import UTC, date, datetime, timedelta, timezone
from decimal import Decimal

import pytest

from storage.finance.attribution import attribute_busy_seconds
from storage.finance.prices import PriceBook, PriceVersion, cost_block, price_job, token_weighted_mean_batch_size

BOOK = PriceBook.from_dict(
    {
        "prices": [
            {"model": "m", "effective_from": "2025-01-01", "input_usd_per_mtok": "1.00", "output_usd_per_mtok": "4"},
            {"model": "m", "effective_from": "2025-06-01", "input_usd_per_mtok": 0.5, "output_usd_per_mtok": 2},
            {"model": "*", "effective_from": "2024-01-01", "input_usd_per_mtok": "9", "output_usd_per_mtok": "9"},
        ],
        "completion_windows": {"24h": "0.5", "7d": "0.7"},
    }
)


def test_price_changes_on_its_effective_date() -> None:
    assert BOOK.price_for("m", datetime(2025, 5, 31, 23, 59, tzinfo=UTC)).input_usd_per_mtok == Decimal("1.00")
    assert BOOK.price_for("m", datetime(2025, 6, 1, 0, 0, tzinfo=UTC)).input_usd_per_mtok == Decimal("0.5")
    assert BOOK.price_for("m", datetime(2030, 1, 1)).output_usd_per_mtok == Decimal(2)


def test_price_dates_are_utc() -> None:
    # 1 June 01:00 in UTC+2 is still 31 May in UTC, so the old price applies.
    at = datetime(2025, 6, 1, 1, 0, tzinfo=timezone(timedelta(hours=2)))
    assert BOOK.price_for("m", at).input_usd_per_mtok == Decimal("1.00")
    assert BOOK.price_for("m", int(datetime(2025, 6, 2, tzinfo=UTC).timestamp())).input_usd_per_mtok == Decimal("0.5")


def test_unknown_model_and_too_early_dates_fall_back_to_star() -> None:
    assert BOOK.price_for("other", datetime(2025, 1, 1)).model == "*"
    assert BOOK.price_for("m", datetime(2024, 12, 31)).model == "*"


def test_no_price_at_all_is_a_lookup_error() -> None:
    book = PriceBook(versions=(PriceVersion("m", date(2025, 1, 1), Decimal(1), Decimal(1)),))
    with pytest.raises(LookupError):
        book.price_for("x", datetime(2025, 1, 2))


def test_default_book_prices_the_demo_model_and_anything_else() -> None:
    book = PriceBook()
    demo = book.price_for("backfill-demo", datetime.now(UTC))
    other = book.price_for("someone/else", datetime.now(UTC))
    assert (demo.input_usd_per_mtok, demo.output_usd_per_mtok) == (Decimal("0.60"), Decimal("2.40"))
    assert other.model == "*"
    assert book.node_usd_per_hour == Decimal("31.92")
    assert book.discount_for("24h") == Decimal("0.5")


def test_a_configured_book_without_star_keeps_the_default_fallback() -> None:
    book = PriceBook.from_dict(
        {"prices": [{"model": "m", "effective_from": "2025-01-01", "input_usd_per_mtok": 1, "output_usd_per_mtok": 1}]}
    )
    assert book.price_for("x", datetime(2025, 2, 1)).model == "*"


def test_book_round_trips_through_json() -> None:
    again = PriceBook.from_dict(json.loads(json.dumps(BOOK.to_dict())))
    assert again == BOOK


def test_unknown_window_and_bad_discount_are_rejected() -> None:
    with pytest.raises(LookupError):
        BOOK.discount_for("1h")
    with pytest.raises(ValueError):
        PriceBook.from_dict({"completion_windows": {"24h": "1.5"}})


def test_cost_block_bills_list_minus_discount_and_margin_over_compute() -> None:
    block = price_job(
        BOOK,
        model="m",
        created_at=datetime(2025, 7, 1, tzinfo=UTC),
        completion_window="24h",
        input_tokens=1_000_000,
        output_tokens=500_000,
        busy_seconds=Decimal(9),
        mean_batch_size=Decimal("37.5"),
    )
    assert block.list_usd == Decimal("1.5")  # 1M x $0.50 + 0.5M x $2
    assert block.discount_usd == Decimal("0.75")
    assert block.billed_usd == block.list_usd - block.discount_usd
    assert block.discount_pct == Decimal(50)
    assert block.gpu_seconds == Decimal(72)  # 9 s x 8 GPUs
    assert block.compute_usd == Decimal(72) * Decimal("3.99") / 3600
    assert block.margin_usd == block.billed_usd - block.compute_usd
    for money in (block.list_usd, block.billed_usd, block.discount_usd, block.compute_usd, block.margin_usd):
        assert isinstance(money, Decimal)


def test_cost_block_json_rounds_once_to_strings() -> None:
    price = PriceVersion("m", date(2025, 1, 1), Decimal("0.60"), Decimal("2.40"))
    block = cost_block(
        input_tokens=7,
        output_tokens=3,
        busy_seconds=0.1234567,
        gpu_count=8,
        usd_per_gpu_hour=Decimal("3.99"),
        discount=Decimal("0.5"),
        price=price,
    )
    rendered = block.to_json()
    assert rendered["list_usd"] == "0.000011"  # 7 x 0.6 + 3 x 2.4 = 11.4 micro-dollars
    assert rendered["billed_usd"] == "0.000006"  # 5.7 rounds up, once, at display
    assert rendered["discount_pct"] == "50.00"
    assert rendered["gpu_seconds"] == "0.988"
    assert rendered["mean_batch_size"] is None
    assert rendered["input_tokens"] == 7
    assert block.billed_usd == Decimal("0.0000057")  # the stored value stays exact
    json.dumps(rendered)


def test_token_weighted_mean_batch_leans_to_the_big_steps() -> None:
    # 10 tokens at batch 10 and 1 token at batch 1: a token most likely ran in the big batch.
    assert token_weighted_mean_batch_size([10, 1]) == Decimal(101) / 11
    assert token_weighted_mean_batch_size([]) is None


def test_attribution_sums_exactly_to_the_run_total() -> None:
    shares = {"a": (1000, 10), "b": (0, 7), "c": (3, 3), "d": (17, 0)}
    for total in (10.0, 0.1, 123.456789, Decimal("1.000000000001"), 0):
        parts = attribute_busy_seconds(total, shares)
        assert sum(parts.values()) == Decimal(str(total))
        assert all(isinstance(p, Decimal) for p in parts.values())


def test_attribution_is_proportional_to_work() -> None:
    parts = attribute_busy_seconds(12, {"a": (0, 100), "b": (0, 200), "c": (1000, 0)}, prefill_weight=Decimal("0.1"))
    assert parts == {"a": Decimal(3), "b": Decimal(6), "c": Decimal(3)}


def test_attribution_weights_decode_over_prefill_by_default() -> None:
    parts = attribute_busy_seconds(1, {"prompt_heavy": (1000, 10), "answer_heavy": (10, 1000)})
    assert parts["answer_heavy"] > 3 * parts["prompt_heavy"]


def test_attribution_of_jobs_without_tokens_splits_equally() -> None:
    parts = attribute_busy_seconds(1, {"a": (0, 0), "b": (0, 0), "c": (0, 0)})
    assert sum(parts.values()) == 1
    assert max(parts.values()) - min(parts.values()) == Decimal("1e-9")


def test_attribution_rejects_nothing_to_split_and_negatives() -> None:
    with pytest.raises(ValueError):
        attribute_busy_seconds(1, {})
    with pytest.raises(ValueError):
        attribute_busy_seconds(-1, {"a": (1, 1)})
    with pytest.raises(ValueError):
        attribute_busy_seconds(1, {"a": (-1, 1)})


def test_a_window_no_longer_offered_earns_no_discount() -> None:
    block = price_job(
        BOOK,
        model="m",
        created_at=datetime(2025, 7, 1, tzinfo=UTC),
        completion_window="1h",
        input_tokens=1_000_000,
        output_tokens=0,
        busy_seconds=Decimal(1),
    )
    assert block.list_usd == Decimal("0.5") and block.discount_usd == 0 and block.billed_usd == block.list_usd
