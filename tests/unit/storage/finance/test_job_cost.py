"""Per-job cost from measured engine runs: attribution sums, billing rules, Decimal money (SQLite and Postgres)."""

from __future__ import annotations

import json
from decimal import Decimal

import pytest
from sqlalchemy import event
from sqlalchemy.orm import Session

from storage import lifecycle
from storage.db import get_engine
from storage.finance.job_cost import batch_cost, batch_cost_json, run_costs
from storage.settings import Settings
from tests.factories import DAY, DAY0, make_batch, make_request, make_run, make_tenant

PRICES = {
    "prices": [
        {"model": "fake-model", "effective_from": "2026-01-01", "input_usd_per_mtok": "1", "output_usd_per_mtok": "2"},
        {"model": "fake-model", "effective_from": "2026-03-10", "input_usd_per_mtok": "3", "output_usd_per_mtok": "6"},
    ]
}
pytestmark = pytest.mark.backfill_env(
    {
        "BACKFILL_PRICE_BOOK": json.dumps(PRICES),
        "BACKFILL_COMPLETION_WINDOWS": '{"24h": "0.5", "7d": "0.75"}',
        "BACKFILL_GPU_COUNT": "8",
        "BACKFILL_GPU_HOUR_USD": "3.6",
        "BACKFILL_PREFILL_WEIGHT": "0.2",
    }
)
# 8 GPUs at $3.60 per GPU-hour: exactly $0.008 per busy second of the node.
NODE_USD_PER_SECOND = Decimal("0.008")


def test_a_runs_busy_time_splits_by_work_and_the_parts_sum_to_the_run(session: Session, settings: Settings) -> None:
    acme, globex = make_tenant(session, "acme"), make_tenant(session, "globex")
    a, b = make_batch(session, tenant=acme), make_batch(session, tenant=globex)
    run = make_run(session, busy_seconds=100.0)
    for _ in range(2):  # work = 500 + 0.2 x 1000 = 700 each
        make_request(session, batch=a, run=run, prompt_tokens=1000, completion_tokens=500)
    make_request(session, batch=b, run=run, prompt_tokens=0, completion_tokens=600)  # work 600

    costs = run_costs(session, run.id, settings=settings)

    assert costs is not None
    assert costs.batch_busy_seconds == {a.id: Decimal(70), b.id: Decimal(30)}
    assert sum(costs.batch_busy_seconds.values()) == costs.busy_seconds == Decimal(100)
    assert costs.compute_usd == Decimal("0.8") == 100 * NODE_USD_PER_SECOND
    assert sum(costs.batch_compute_usd.values()) == costs.compute_usd
    assert all(isinstance(v, Decimal) for v in costs.batch_compute_usd.values())


def test_awkward_busy_times_still_sum_exactly(session: Session, settings: Settings) -> None:
    tenant = make_tenant(session)
    run = make_run(session, busy_seconds=10.0 / 3)
    batches = [make_batch(session, tenant=tenant) for _ in range(7)]
    for index, batch in enumerate(batches):
        make_request(session, batch=batch, run=run, prompt_tokens=index * 37, completion_tokens=11 + index)

    costs = run_costs(session, run.id, settings=settings)

    assert costs is not None
    assert sum(costs.batch_busy_seconds.values()) == Decimal(str(10.0 / 3))
    assert abs(sum(costs.batch_compute_usd.values()) - costs.compute_usd) <= costs.compute_usd / 100


def test_job_cost_block_prices_tokens_at_list_less_discount_and_compute_at_the_node_rate(
    session: Session, settings: Settings
) -> None:
    tenant = make_tenant(session)
    batch, other = make_batch(session, tenant=tenant), make_batch(session, tenant=tenant)
    run = make_run(session, busy_seconds=100.0, steps=100, running_seq_steps=800)
    make_request(session, batch=batch, run=run, prompt_tokens=2000, completion_tokens=1000)  # work 1400
    make_request(session, batch=other, run=run, prompt_tokens=0, completion_tokens=600)

    block = batch_cost(session, batch=batch, settings=settings)

    assert block is not None
    assert block.list_usd == Decimal("0.004")  # 2000 x $1/M + 1000 x $2/M
    assert block.discount_pct == Decimal(50) and block.discount_usd == Decimal("0.002")
    assert block.billed_usd == Decimal("0.002")
    assert block.gpu_seconds == Decimal(70 * 8)
    assert block.compute_usd == 70 * NODE_USD_PER_SECOND
    assert block.margin_usd == block.billed_usd - block.compute_usd
    assert block.mean_batch_size == Decimal(8)
    money = (block.list_usd, block.discount_usd, block.billed_usd, block.compute_usd, block.margin_usd)
    assert all(isinstance(value, Decimal) for value in money)
    assert batch_cost_json(session, batch, settings) == block.to_json()
    assert block.to_json()["compute_usd"] == "0.560000"


def test_failed_expired_and_cancelled_requests_are_not_billed_and_completed_work_carries_their_time(
    session: Session, settings: Settings
) -> None:
    tenant = make_tenant(session)
    batch, other = make_batch(session, tenant=tenant), make_batch(session, tenant=tenant)
    run = make_run(session, busy_seconds=100.0)
    make_request(session, batch=batch, run=run, prompt_tokens=1000, completion_tokens=500)  # work 700
    make_request(session, batch=other, run=run, prompt_tokens=1000, completion_tokens=100)  # work 300
    make_request(session, batch=batch, run=run, status=lifecycle.REQ_FAILED, prompt_tokens=9000, completion_tokens=9000)
    make_request(session, batch=batch, status=lifecycle.REQ_EXPIRED)
    make_request(session, batch=other, status=lifecycle.REQ_CANCELLED)

    block = batch_cost(session, batch=batch, settings=settings)

    assert block is not None
    assert (block.input_tokens, block.output_tokens) == (1000, 500)
    assert block.gpu_seconds == Decimal(70 * 8)  # 70% of the run, not diluted by the failed request
    costs = run_costs(session, run.id, settings=settings)
    assert costs is not None and sum(costs.batch_busy_seconds.values()) == Decimal(100)


def test_a_job_with_nothing_completed_has_no_cost_block(session: Session, settings: Settings) -> None:
    batch = make_batch(session, tenant=make_tenant(session))
    make_request(session, batch=batch, status=lifecycle.REQ_QUEUED)
    make_request(session, batch=batch, status=lifecycle.REQ_FAILED, prompt_tokens=10, completion_tokens=10)

    assert batch_cost(session, batch=batch, settings=settings) is None
    assert batch_cost_json(session, batch, settings) is None


def test_a_job_across_two_runs_adds_its_shares_and_weights_batch_size_by_its_tokens(
    session: Session, settings: Settings
) -> None:
    batch = make_batch(session, tenant=make_tenant(session))
    busy8 = make_run(session, busy_seconds=30.0, steps=100, running_seq_steps=800)  # mean batch 8
    busy2 = make_run(session, busy_seconds=20.0, steps=50, running_seq_steps=100)  # mean batch 2
    make_request(session, batch=batch, run=busy8, completion_tokens=300)
    make_request(session, batch=batch, run=busy2, completion_tokens=100)

    block = batch_cost(session, batch=batch, settings=settings)

    assert block is not None
    assert block.gpu_seconds == Decimal(50 * 8)
    assert block.mean_batch_size == Decimal("6.5")  # (300 x 8 + 100 x 2) / 400


def test_list_price_is_the_one_in_force_when_the_batch_was_created(session: Session, settings: Settings) -> None:
    tenant = make_tenant(session)
    old = make_batch(session, tenant=tenant, created_at=DAY0)  # 2026-03-02: $1 / $2
    new = make_batch(session, tenant=tenant, created_at=DAY0 + 9 * DAY)  # 2026-03-11: $3 / $6
    run = make_run(session, busy_seconds=1.0)
    for batch in (old, new):
        make_request(session, batch=batch, run=run, prompt_tokens=1_000_000, completion_tokens=1_000_000)

    old_block = batch_cost(session, batch=old, settings=settings)
    new_block = batch_cost(session, batch=new, settings=settings)

    assert old_block is not None and new_block is not None
    assert (old_block.list_usd, new_block.list_usd) == (Decimal(3), Decimal(9))


def test_a_longer_completion_window_earns_its_own_discount(session: Session, settings: Settings) -> None:
    batch = make_batch(session, tenant=make_tenant(session), completion_window="7d")
    make_request(session, batch=batch, run=make_run(session, busy_seconds=1.0), completion_tokens=1_000_000)

    block = batch_cost(session, batch=batch, settings=settings)

    assert block is not None
    assert (block.list_usd, block.discount_usd, block.billed_usd) == (Decimal(2), Decimal("1.5"), Decimal("0.5"))


def test_job_cost_is_a_fixed_number_of_grouped_queries_however_many_requests(
    session: Session, settings: Settings
) -> None:
    tenant = make_tenant(session)
    batch, other = make_batch(session, tenant=tenant), make_batch(session, tenant=tenant)
    runs = [make_run(session, busy_seconds=10.0) for _ in range(3)]
    for index in range(300):
        make_request(session, batch=batch if index % 3 else other, run=runs[index % 3], completion_tokens=5)
    statements: list[str] = []

    def count(*args: object) -> None:
        statements.append(str(args[2]))

    event.listen(get_engine(), "before_cursor_execute", count)
    try:
        block = batch_cost(session, batch=batch, settings=settings)
    finally:
        event.remove(get_engine(), "before_cursor_execute", count)

    assert block is not None and block.output_tokens == 200 * 5
    assert len(statements) == 2, statements
