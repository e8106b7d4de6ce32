"""The claim order on a real database: the deadline ramp and prefix-aware grouping, on SQLite and Postgres."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator

import pytest
from sqlalchemy import select

from storage.clock import now
from storage.db import get_sessionmaker, transaction
from storage.models import BatchRequest
from storage.queue.backlog import drain_seconds
from storage.queue.claim import ClaimedRequest, claim
from storage.queue.claim_order import ClaimOrder, claim_order, drain_cache, urgency_horizon
from storage.settings import Settings, get_settings
from tests.conftest import Backend
from tests.factories import make_batch, make_request, make_run, make_tenant
from tests.integration.jobs import chat, submit_job

pytestmark = pytest.mark.backfill_env({"BACKFILL_MODELS": json.dumps({"fake-model": {"path": "fake:"}})})

HOUR = 3600
PROMPTS = [f"You are reviewer number {k}. " + "Follow the house style guide carefully. " * 20 for k in range(3)]


@pytest.fixture(autouse=True)
def fresh_drain_cache() -> Iterator[None]:
    drain_cache.clear()
    yield
    drain_cache.clear()


def claim_all(order: ClaimOrder, *, size: int) -> list[ClaimedRequest]:
    """Claim `size` rows at a time until the queue is empty, as a runner tops up."""
    claimed: list[ClaimedRequest] = []
    while True:
        with transaction() as session:
            batch = claim(
                session,
                settings=get_settings(),
                model="fake-model",
                worker_id="w",
                limit=size,
                lease_seconds=60,
                order=order,
            )
        if not batch:
            return claimed
        claimed.extend(batch)


def system_of(item: ClaimedRequest) -> str:
    return str(item.body["messages"][0]["content"])


def changes(values: list[str]) -> int:
    return sum(1 for a, b in itertools.pairwise(values) if a != b)


def next_bucket_start(offset_buckets: int = 2) -> int:
    return (now() // HOUR + offset_buckets) * HOUR


def test_prefix_ordering_keeps_a_system_prompt_together_across_claims(backend: Backend) -> None:
    submit_job([chat(i, PROMPTS[i % 3]) for i in range(30)])  # lines cycle through three system prompts

    grouped = claim_all(ClaimOrder(prefix_ordering=True), size=4)

    assert len(grouped) == 30
    assert changes([system_of(c) for c in grouped]) == 2  # three runs, each prompt's ten rows in a row


def test_without_prefix_ordering_rows_go_in_line_order(backend: Backend) -> None:
    submit_job([chat(i, PROMPTS[i % 3]) for i in range(30)])

    plain = claim_all(ClaimOrder(prefix_ordering=False), size=4)

    assert [c.body["messages"][1]["content"] for c in plain] == [f"question {i}" for i in range(30)]
    assert changes([system_of(c) for c in plain]) == 29


def test_prefix_groups_span_jobs_in_one_deadline_bucket_but_not_later_buckets(backend: Backend) -> None:
    base = next_bucket_start()
    first, _ = submit_job([chat(i, PROMPTS[i % 2]) for i in range(10)], deadline=base + 100)
    second, _ = submit_job([chat(i, PROMPTS[(i + 1) % 2]) for i in range(10)], deadline=base + 200)
    later, _ = submit_job([chat(i, PROMPTS[0]) for i in range(6)], deadline=base + HOUR + 50)

    claimed = claim_all(ClaimOrder(prefix_ordering=True, bucket_seconds=HOUR), size=3)

    same_bucket = claimed[:20]
    assert {c.batch_id for c in same_bucket} == {first, second}
    assert changes([system_of(c) for c in same_bucket]) == 1  # both jobs' rows of one prompt, then the other's
    assert {c.batch_id for c in claimed[20:]} == {later}


def test_urgent_requests_go_ahead_of_the_fair_share_and_are_flagged(backend: Backend, settings: Settings) -> None:
    submit_job([chat(i) for i in range(20)], tenant="steady", deadline=now() + 20 * HOUR)
    submit_job([chat(i) for i in range(20)], tenant="calm", deadline=now() + 21 * HOUR)
    rush, _ = submit_job([chat(i) for i in range(3)], tenant="rush", deadline=now() + 600)

    with transaction() as session:
        order = claim_order(session, model="fake-model", settings=settings)  # horizon: 900 s by default
        claimed = claim(
            session, settings=get_settings(), model="fake-model", worker_id="w", limit=6, lease_seconds=60, order=order
        )

    assert [c.batch_id for c in claimed[:3]] == [rush] * 3 and all(c.urgent for c in claimed[:3])
    assert not any(c.urgent for c in claimed[3:]) and len(claimed) == 6


def test_without_urgency_the_near_deadline_tenant_gets_only_its_fair_share(backend: Backend) -> None:
    submit_job([chat(i) for i in range(20)], tenant="steady", deadline=now() + 20 * HOUR)
    submit_job([chat(i) for i in range(20)], tenant="calm", deadline=now() + 21 * HOUR)
    rush, _ = submit_job([chat(i) for i in range(3)], tenant="rush", deadline=now() + 600)

    with transaction() as session:
        claimed = claim(
            session,
            settings=get_settings(),
            model="fake-model",
            worker_id="w",
            limit=6,
            lease_seconds=60,
            order=ClaimOrder(),
        )

    assert sum(1 for c in claimed if c.batch_id == rush) == 2  # 6 / 3 tenants
    assert not any(c.urgent for c in claimed)


def test_among_urgent_requests_the_earliest_deadline_wins_over_fairness(backend: Backend) -> None:
    sooner, _ = submit_job([chat(i) for i in range(5)], tenant="a", deadline=now() + 300)
    submit_job([chat(i) for i in range(5)], tenant="b", deadline=now() + 700)
    order = ClaimOrder(urgent_before=now() + 900, prefix_ordering=True)

    with transaction() as session:
        claimed = claim(
            session, settings=get_settings(), model="fake-model", worker_id="w", limit=5, lease_seconds=60, order=order
        )

    assert [c.batch_id for c in claimed] == [sooner] * 5


def test_the_urgency_horizon_widens_with_the_backlog_drain_time(backend: Backend, settings: Settings) -> None:
    with transaction() as session:
        make_run(session, busy_seconds=100.0, completion_tokens=1000)  # 10 output tokens per busy second
        batch = make_batch(session, tenant=make_tenant(session))
        for _ in range(72):
            make_request(session, batch=batch, status="queued", max_tokens=1000)  # ~2 hours of work

    with transaction() as session:
        drain = drain_seconds(session, model="fake-model", settings=settings)
        horizon = urgency_horizon(session, model="fake-model", settings=settings)
        flat = urgency_horizon(
            session, model="fake-model", settings=settings.model_copy(update={"urgent_drain_multiple": 0.0})
        )

    assert 7200 <= drain < 7400
    assert horizon == pytest.approx(1.5 * drain) and flat == settings.urgent_within_seconds == 900


def test_concurrent_claims_never_share_a_row(backend: Backend) -> None:
    if backend.name != "postgres":
        pytest.skip("SQLite serialises writers; SKIP LOCKED is a Postgres matter")
    submit_job([chat(i, PROMPTS[i % 3]) for i in range(30)])
    order = ClaimOrder(urgent_before=0, prefix_ordering=True)
    first, second = get_sessionmaker()(), get_sessionmaker()()
    try:
        a = claim(
            first, settings=get_settings(), model="fake-model", worker_id="w1", limit=12, lease_seconds=60, order=order
        )
        b = claim(
            second, settings=get_settings(), model="fake-model", worker_id="w2", limit=12, lease_seconds=60, order=order
        )
        assert len(a) == len(b) == 12 and not {c.id for c in a} & {c.id for c in b}
    finally:
        first.rollback()
        second.rollback()
        first.close()
        second.close()


def stored_rows(batch_id: str) -> list[tuple[str, int, int]]:
    with transaction() as session:
        rows = session.execute(
            select(BatchRequest.prefix_key, BatchRequest.est_input_tokens, BatchRequest.max_output_tokens)
            .where(BatchRequest.batch_id == batch_id)
            .order_by(BatchRequest.line)
        ).all()
    return [(row[0], row[1], row[2]) for row in rows]


def test_ingest_keys_shared_prefixes_and_sizes_each_row(backend: Backend, monkeypatch: pytest.MonkeyPatch) -> None:
    from worker.jobs import ingest

    monkeypatch.setattr(ingest, "INSERT_CHUNK", 2)  # the first row of a prefix is inserted before its partner
    unique = [f"Only for line {i}: " + "x" * 200 for i in range(3)]
    systems = [PROMPTS[0], unique[0], unique[1], PROMPTS[1], PROMPTS[0], PROMPTS[1], unique[2]]
    batch_id, status = submit_job([chat(i, system, max_tokens=7) for i, system in enumerate(systems)])

    rows = stored_rows(batch_id)

    keys = [row[0] for row in rows]
    assert status == "in_progress"
    assert keys[0] == keys[4] != keys[3] == keys[5] and len(keys[0]) == 32 and len(keys[3]) == 32
    assert keys[1] == keys[2] == keys[6] == ""  # a prefix no other line shares keeps line order
    assert all(row[1] > 50 and row[2] == 7 for row in rows)


def test_requests_without_a_shared_prefix_are_claimed_in_line_order(backend: Backend) -> None:
    submit_job([chat(i, f"Context for item {i}. " + "y" * 600) for i in range(12)])

    claimed = claim_all(ClaimOrder(prefix_ordering=True), size=5)

    assert [c.body["messages"][1]["content"] for c in claimed] == [f"question {i}" for i in range(12)]
