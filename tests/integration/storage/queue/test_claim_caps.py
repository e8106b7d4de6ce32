"""Spend caps at claim time (issue 36 item 4): a capped batch is leased only what its cap has room for.

Prices make every figure exact: input is free and an output token bills $1 (list $2, the 24h window's 50% off),
so a line with max_tokens=100 reserves $100 when it is claimed.
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from collections.abc import Callable

import pytest
from sqlalchemy import select, text
from sqlalchemy.orm import Session

from storage.db import get_sessionmaker, transaction
from storage.models import Batch, BatchRequest
from storage.queue.claim import ClaimedRequest, claim
from storage.queue.claim_order import ClaimOrder
from storage.queue.leases import release, take_back
from storage.queue.reaping import release_expired_leases
from storage.queue.results import Outcome, record
from storage.settings import get_settings
from tests.conftest import Backend
from tests.factories import expire_leases
from tests.integration.jobs import chat, submit_job

PRICES = {
    "prices": [
        {
            "model": "fake-model",
            "effective_from": "2025-01-01",
            "input_usd_per_mtok": "0",
            "output_usd_per_mtok": "2000000",
        }
    ]
}
pytestmark = pytest.mark.backfill_env(
    {"BACKFILL_MODELS": json.dumps({"fake-model": {"path": "fake:"}}), "BACKFILL_PRICE_BOOK": json.dumps(PRICES)}
)
ORDER = ClaimOrder()  # no urgency horizon to size: the claim sends only its own statements


def _capped_job(lines: int, *, cap_usd: int, tenant: str = "acme") -> str:
    batch_id, _ = submit_job([chat(i, max_tokens=100) for i in range(lines)], tenant=tenant)
    with transaction() as session:
        session.get_one(Batch, batch_id).max_cost_micro_usd = cap_usd * 1_000_000
    return batch_id


def _claim(limit: int, *, worker: str = "w", session: Session | None = None) -> list[ClaimedRequest]:
    settings = get_settings()
    if session is not None:
        return claim(session, settings=settings, model="fake-model", worker_id=worker, limit=limit, lease_seconds=60)
    with transaction() as fresh:
        return claim(fresh, settings=settings, model="fake-model", worker_id=worker, limit=limit, lease_seconds=60)


def _finish(items: list[ClaimedRequest], *, worker: str = "w") -> None:
    """Record each at its full 100 output tokens ($100)."""
    with transaction() as session:
        record(session, worker_id=worker, run_id="run_1", outcomes=[Outcome(i.id, 200, {}, 5, 100, 0.1) for i in items])


def _statuses(batch_id: str) -> dict[str, int]:
    with transaction() as session:
        return dict(Counter(session.scalars(select(BatchRequest.status).where(BatchRequest.batch_id == batch_id))))


def test_a_capped_batch_is_leased_only_what_its_cap_has_room_for_and_other_work_fills_the_claim(
    backend: Backend,
) -> None:
    capped = _capped_job(20, cap_usd=250)
    other, _ = submit_job([chat(i) for i in range(20)], tenant="other")
    first = _claim(16)
    mine = [item for item in first if item.batch_id == capped]
    # $0, $100 and $200 reserved are each under $250: three rows, the third crossing the cap; not a fourth.
    assert len(mine) == 3 and len(first) == 16 and all(item.capped for item in mine)
    assert not [item for item in _claim(16) if item.batch_id == capped]  # no room while those run

    _finish(mine[:2])  # $200 billed, $100 still reserved: no room yet
    assert {item.batch_id for item in _claim(16)} <= {other}
    _finish(mine[2:])  # $300 billed: the cap is reached, the rest ends unrun
    assert _statuses(capped) == {"completed": 3, "failed": 17}
    with transaction() as session:
        batch = session.get_one(Batch, capped)
        assert [w["code"] for w in batch.warnings or []] == ["budget_exceeded"]


def test_a_batch_under_its_cap_gets_room_again_as_its_results_land(backend: Backend) -> None:
    capped = _capped_job(10, cap_usd=350)
    first = _claim(8)
    assert len(first) == 4  # $0..$300 reserved
    _finish(first[:1])  # billed $100, reserved $300: $400, no room
    assert _claim(8) == []
    with transaction() as session:  # a drain hands the last one back unrun: its reservation goes with it
        release(session, worker_id="w", request_ids=[first[3].id])
    again = _claim(8)
    assert [item.batch_id for item in again] == [capped]  # $100 + $200 reserved = $300 < $350: one more
    _finish(first[1:3] + again)  # $400 billed: stopped
    assert _statuses(capped) == {"completed": 4, "failed": 6}


def test_rows_handed_back_after_the_cap_was_reached_end_unrun_at_the_next_claim(backend: Backend) -> None:
    """A worker's drain (or a reaped lease) re-queues a row after the batch reached its cap: it used to run again
    past the cap; now the next claim ends it as `budget_exceeded`, as the stop would have."""
    capped = _capped_job(6, cap_usd=1000)
    running = _claim(6)
    assert len(running) == 6
    with transaction() as session:  # the cap is lowered under the running rows (as a retry's inherited cap may be)
        session.get_one(Batch, capped).max_cost_micro_usd = 150 * 1_000_000
    _finish(running[:2])  # $200 billed: past $150
    with transaction() as session:
        release(session, worker_id="w", request_ids=[item.id for item in running[2:]])
    assert _statuses(capped) == {"completed": 2, "queued": 4}
    assert _claim(6) == []
    assert _statuses(capped) == {"completed": 2, "failed": 4}
    with transaction() as session:
        rows = session.scalars(select(BatchRequest).where(BatchRequest.status == "failed"))
        assert {(row.error_code, row.attempts) for row in rows} == {("budget_exceeded", 0)}


def _hand_over(request_id: str) -> None:
    """Its lease lapsed while its worker still ran it (the database was away): the reaper re-queues it. Its
    deadline moves a second later, so the next claim picks the batch's other rows first."""
    with transaction() as session:
        row = session.get_one(BatchRequest, request_id)
        row.deadline += 1
        session.flush()
        expire_leases(session, [request_id])
        assert release_expired_leases(session, max_attempts=3) == 1


def test_a_worker_takes_back_a_handed_over_lease_only_while_its_batch_has_room(backend: Backend) -> None:
    """A lease taken back is a claim too: when the room the hand-over freed went to another row meanwhile, the
    worker drops its copy instead of running both past the cap."""
    capped = _capped_job(10, cap_usd=250)
    running = _claim(8)  # $0, $100, $200 reserved
    assert len(running) == 3
    _hand_over(running[2].id)
    with transaction() as session:  # nothing took the room: the worker keeps running it
        assert take_back(session, worker_id="w", request_ids=[running[2].id], lease_seconds=60) == {running[2].id}
    _hand_over(running[2].id)
    taken = _claim(8, worker="w2")
    assert len(taken) == 1 and taken[0].id != running[2].id  # the freed room went to another row
    with transaction() as session:
        assert take_back(session, worker_id="w", request_ids=[running[2].id], lease_seconds=60) == set()
    assert _statuses(capped) == {"running": 3, "queued": 7}


def test_two_workers_claiming_at_once_never_both_spend_a_caps_room(backend: Backend) -> None:
    """The second claim waits for the first one's lock on the capped batch, then sees its reservations."""
    if backend.name != "postgres":
        pytest.skip("SQLite runs one writer at a time")
    capped = _capped_job(20, cap_usd=250)
    other, _ = submit_job([chat(i) for i in range(20)], tenant="other")
    first, second = get_sessionmaker()(), get_sessionmaker()()
    found: list[ClaimedRequest] = []
    try:
        a = _claim(8, worker="w1", session=first)  # holds the capped batch until it commits
        assert len([item for item in a if item.batch_id == capped]) == 3
        waiting = threading.Thread(target=lambda: found.extend(_claim(8, worker="w2", session=second)))
        waiting.start()
        _wait_for_a_lock_wait(lambda: not waiting.is_alive())
        first.commit()
        waiting.join(30)
        assert [item.batch_id for item in found] == [other] * 8  # no room left for w2 in the capped batch
    finally:
        first.rollback()
        second.rollback()
        first.close()
        second.close()


def _wait_for_a_lock_wait(done: Callable[[], bool]) -> None:
    """Until a backend waits on a row lock (or `done`): what the database says, not how long anything took."""
    from storage.db import get_engine

    with get_engine().connect() as conn:
        for _ in range(3000):
            waits = conn.execute(text("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"))
            if waits.scalar() or done():
                return
            conn.rollback()
            time.sleep(0.01)
    raise AssertionError("the second claim neither waited nor finished")


def _statements_during(work: Callable[[Session], object]) -> list[str]:
    from sqlalchemy import event

    from storage.db import get_engine

    sent: list[str] = []

    def seen(conn: object, cursor: object, statement: str, *args: object) -> None:
        sent.append(" ".join(statement.split()))

    event.listen(get_engine(), "before_cursor_execute", seen)
    try:
        with transaction() as session:
            work(session)
    finally:
        event.remove(get_engine(), "before_cursor_execute", seen)
    return sent


def test_a_claim_of_uncapped_work_reads_no_spend_and_locks_no_batch(backend: Backend) -> None:
    """Spend caps cost uncapped batches nothing: the claim reads the batches (one statement, as before),
    picks and leases; no sum of results, no batch lock."""
    submit_job([chat(i) for i in range(6)], tenant="a")
    submit_job([chat(i) for i in range(6)], tenant="b")
    claimed: list[ClaimedRequest] = []

    def work(session: Session) -> None:
        claimed.extend(
            claim(
                session,
                settings=get_settings(),
                model="fake-model",
                worker_id="w",
                limit=8,
                lease_seconds=60,
                order=ORDER,
            )
        )

    sent = _statements_during(work)
    assert len(claimed) == 8
    lease = next(i for i, s in enumerate(sent) if s.startswith("UPDATE batch_requests"))
    assert sent[0].startswith("SELECT batches.id") and all(
        s.startswith("SELECT batch_requests.id") for s in sent[1:lease]
    )
    assert not [s for s in sent if "sum(" in s or "UPDATE batches" in s or "FOR UPDATE OF batches" in s]


def test_a_batch_ingested_between_the_claims_read_of_the_batches_and_its_pick_waits_for_the_next_claim(
    backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A claim reads the open batches (their caps, pauses, trials), then picks rows in a later statement. A batch
    whose ingest commits in between has queued rows the pick can see and no cap the claim knows of: its rows are
    left for the next claim, which sees the batch (chaos seed 12 --workflow: a capped 8 s batch, urgent at once,
    billed 2.4 requests past its cap before the fix)."""
    import storage.queue.claim as claim_module

    other, _ = submit_job([chat(i) for i in range(4)], tenant="other")
    with transaction() as session:
        before = claim_module.open_batches(session, model="fake-model")  # the read, before the ingest below
    capped = _capped_job(20, cap_usd=250, tenant="other")  # a tenant the read knew: the pick takes its rows
    monkeypatch.setattr(claim_module, "open_batches", lambda session, *, model: before)
    first = _claim(16)
    assert {item.batch_id for item in first} == {other}  # none of the batch the claim did not read
    monkeypatch.undo()
    mine = [item for item in _claim(16) if item.batch_id == capped]
    assert len(mine) == 3 and all(item.capped for item in mine)  # the next claim knows its cap: $0, $100, $200
