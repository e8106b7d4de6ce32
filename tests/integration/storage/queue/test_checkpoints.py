"""Generation checkpoints beside the queue row: stored with a hand-back, handed to the next claim, never shrunk,
written as append-only chunks (each write adds only the new tokens) under the claim alone, no queue row written,
gone when the row ends."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable

import pytest
from sqlalchemy import delete, func, insert, select, text, update
from sqlalchemy.orm import Session

from storage.batches.control import cancel_batch, pause_batch, resume_batch
from storage.db import get_sessionmaker, transaction
from storage.models import Batch, BatchRequest, Checkpoint, CheckpointChunk, Lease
from storage.queue.checkpoints import Generated, pack_tokens, restart, save, stored_tokens, sweep, unpack_tokens
from storage.queue.claim import ClaimedRequest, claim
from storage.queue.leases import release, renew
from storage.queue.reaping import expire_overdue, release_worker_leases
from storage.queue.results import Outcome, record
from storage.settings import get_settings
from tests.conftest import Backend
from tests.integration.jobs import chat, submit_job

pytestmark = pytest.mark.backfill_env({"BACKFILL_MODELS": json.dumps({"fake-model": {"path": "fake:"}})})


def _claimed(worker: str, limit: int = 3) -> list[ClaimedRequest]:
    with transaction() as session:
        return claim(
            session, settings=get_settings(), model="fake-model", worker_id=worker, limit=limit, lease_seconds=60
        )


def _claim(worker: str, limit: int = 3) -> dict[str, str]:
    """Claim up to `limit` rows for `worker`: request id -> the claim's id."""
    return {row.id: row.claim_id for row in _claimed(worker, limit)}


def _row(request_id: str) -> BatchRequest:
    with transaction() as session:
        row = session.get(BatchRequest, request_id)
        assert row is not None
        return row


def _stored(request_id: str) -> list[int]:
    with transaction() as session:
        return stored_tokens(session, request_id=request_id)


def _chunks(request_id: str) -> list[tuple[int, list[int]]]:
    with transaction() as session:
        query = select(CheckpointChunk.start, CheckpointChunk.token_ids).where(CheckpointChunk.request_id == request_id)
        return [(start, unpack_tokens(blob)) for start, blob in session.execute(query.order_by(CheckpointChunk.start))]


def _all_chunks() -> int:
    with transaction() as session:
        return int(session.scalar(select(func.count()).select_from(CheckpointChunk)) or 0)


def test_a_drained_request_comes_back_with_the_tokens_it_generated(backend: Backend) -> None:
    submit_job([chat(i) for i in range(2)])
    claims = _claim("w1")
    first, second = claims
    generated = [5, 70_000, 0, 3] * 200
    with transaction() as session:
        checkpoints = {first: Generated(claims[first], generated)}
        released = release(session, worker_id="w1", request_ids=[first, second], checkpoints=checkpoints)
    assert released == 2
    row = _row(first)
    assert row.status == "queued" and row.checkpoint_tokens == 800
    with transaction() as session:  # packed and compressed, not 4 bytes a token
        size = session.scalar(select(func.length(CheckpointChunk.token_ids)).where(CheckpointChunk.request_id == first))
    assert size is not None and size < 800
    assert _row(second).checkpoint_tokens == 0 and _chunks(second) == []
    by_id = {row.id: row for row in _claimed("w2", 2)}
    assert list(by_id[first].checkpoint) == generated
    assert by_id[second].checkpoint == ()


def test_each_checkpoint_write_stores_only_the_new_tokens_and_the_claim_gets_them_all_in_order(
    backend: Backend,
) -> None:
    submit_job([chat(0)])
    ((rid, claim_id),) = _claim("w1").items()
    generated = [(i * 7919) % 128_256 for i in range(3000)]
    for upto in (1024, 2048, 2900):
        with transaction() as session:
            checkpoints = {rid: Generated(claim_id, generated[:upto])}
            assert save(session, checkpoints=checkpoints) == {rid}
    with transaction() as session:  # the hand-back adds the last 100
        release(session, worker_id="w1", request_ids=[rid], checkpoints={rid: Generated(claim_id, generated)})
    assert _chunks(rid) == [
        (0, generated[:1024]),
        (1024, generated[1024:2048]),
        (2048, generated[2048:2900]),
        (2900, generated[2900:]),
    ]
    assert _row(rid).checkpoint_tokens == 3000
    (again,) = _claimed("w2")
    assert list(again.checkpoint) == generated


def test_a_checkpoint_is_never_replaced_by_a_shorter_one_and_only_its_claim_writes(backend: Backend) -> None:
    submit_job([chat(i) for i in range(2)])
    ((rid, claim_id),) = _claim("w1", 1).items()
    ((_, other_claim),) = _claim("w1", 1).items()
    with transaction() as session:
        assert save(session, checkpoints={rid: Generated(claim_id, [1, 2, 3])}) == {rid}
        assert save(session, checkpoints={rid: Generated(claim_id, [1, 2])}) == set()
        longer = {rid: Generated(other_claim, [1, 2, 3, 4])}  # another claim's generation
        assert save(session, checkpoints=longer) == set()
    assert _stored(rid) == [1, 2, 3] and _chunks(rid) == [(0, [1, 2, 3])]


def test_a_write_of_an_earlier_claims_generation_never_lands_on_a_later_ones_tokens(backend: Backend) -> None:
    submit_job([chat(0)])
    ((rid, old_claim),) = _claim("w1").items()
    with transaction() as session:
        save(session, checkpoints={rid: Generated(old_claim, [1] * 10)})
        release(session, worker_id="w1", request_ids=[rid])
    (row,) = _claimed("w1")  # the same worker claims it again: a new claim, a new generation from those 10
    with transaction() as session:
        assert save(session, checkpoints={rid: Generated(row.claim_id, [1] * 10 + [2] * 5)})
        # the first generation's write, late: it holds the same worker's lease yet not its claim
        assert save(session, checkpoints={rid: Generated(old_claim, [1] * 30)}) == set()
    assert _chunks(rid) == [(0, [1] * 10), (10, [2] * 5)]


def _wait_for(condition: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    until = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < until, f"timed out waiting for {what}"
        time.sleep(0.02)


def _renewing(session: Session, *, worker_id: str, checkpoints: dict[str, Generated]) -> set[str]:
    """A periodic checkpoint as a lease renewal stores it; the ids it stored."""
    assert not renew(
        session, worker_id=worker_id, request_ids=sorted(checkpoints), lease_seconds=60, checkpoints=checkpoints
    )
    return {
        rid
        for rid in checkpoints
        if session.get(BatchRequest, rid, populate_existing=True).checkpoint_tokens == len(checkpoints[rid].token_ids)
    }


@pytest.mark.parametrize("second_write", ["save", "renew"])
def test_two_concurrent_writers_from_the_same_count_store_one_of_them_whole(
    backend: Backend, second_write: str
) -> None:
    if backend.name != "postgres":
        pytest.skip("SQLite runs one writer at a time: the sequential cases above are the whole story")
    submit_job([chat(0)])
    ((rid, claim_id),) = _claim("w1").items()
    first = get_sessionmaker()()
    assert save(first, checkpoints={rid: Generated(claim_id, [1] * 10)}) == {rid}
    outcome: dict[str, set[str]] = {}

    def second_writer() -> None:  # reads the row's 0 tokens (the first write is not committed), then waits
        with transaction() as session:
            checkpoints = {rid: Generated(claim_id, [1] * 12)}
            if second_write == "save":
                outcome["second"] = save(session, checkpoints=checkpoints)
            else:
                outcome["second"] = _renewing(session, worker_id="w1", checkpoints=checkpoints)

    thread = threading.Thread(target=second_writer)
    thread.start()

    def waiting() -> bool:  # a transaction per look: pg_stat_activity is read once per transaction
        query = "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()"
        with transaction() as session:
            return bool(session.scalar(text(query)))

    try:
        _wait_for(waiting, "the second writer to wait for the first one's row lock")
        first.commit()
    finally:
        first.close()  # on a failure, a rollback: the second writer goes on
        thread.join(timeout=30)
    assert outcome["second"] == set()  # its count moved meanwhile: nothing appended from a stale start
    assert _chunks(rid) == [(0, [1] * 10)] and _row(rid).checkpoint_tokens == 10


def test_a_renewal_writes_only_the_checkpoints_due_and_the_leases_under_the_same_guards(backend: Backend) -> None:
    submit_job([chat(i) for i in range(4)])
    claims = _claim("w1")
    a, b, c = sorted(claims)
    (other,) = _claim("w2", 1)
    ids = [a, b, c, other]
    due = {
        a: Generated(claims[a], [1] * 5),  # lands
        b: Generated("claim-of-an-earlier-run", [2] * 5),  # another claim's generation: never stored
        other: Generated(claims[a], [3] * 5),  # another worker's row: neither renewed nor stored
    }
    updated = "SELECT pg_stat_get_xact_tuples_updated(CAST(:t AS regclass))"
    tables = ("batch_requests", "leases", "checkpoints")
    with transaction() as session:
        session.execute(update(Lease).values(expires_at=1.0))
        postgres = backend.name == "postgres"
        before = [session.scalar(text(updated), {"t": t}) for t in tables] if postgres else []
        assert renew(session, worker_id="w1", request_ids=ids, lease_seconds=600, checkpoints=due) == {other}
        if postgres:  # no queue row at all; w1's one lease; the one checkpoint's count
            after = [session.scalar(text(updated), {"t": t}) for t in tables]
            assert [x - y for x, y in zip(after, before, strict=True)] == [0, 1, 1]
        # a shorter write (the count moved past it) renews and stores nothing
        assert not renew(session, worker_id="w1", request_ids=[a], lease_seconds=600, checkpoints={a: due[a]})
    assert _chunks(a) == [(0, [1] * 5)] and _row(a).checkpoint_tokens == 5
    assert _chunks(b) == [] and _row(b).checkpoint_tokens == 0 and _chunks(other) == []
    assert all(_lease_expiry(rid) > 100 for rid in (a, b, c)) and _lease_expiry(other) == 1.0
    with transaction() as session:  # the next write appends after the count, as `save` does
        later = {a: Generated(claims[a], [1] * 5 + [4] * 3)}
        assert not renew(session, worker_id="w1", request_ids=[a, b], lease_seconds=600, checkpoints=later)
    assert _chunks(a) == [(0, [1] * 5), (5, [4] * 3)]


def _lease_expiry(request_id: str) -> float:
    with transaction() as session:
        return session.get_one(Lease, _row(request_id).lease_id).expires_at


def test_a_paused_request_keeps_the_tokens_its_worker_stores_after_losing_the_lease(backend: Backend) -> None:
    batch_id, _ = submit_job([chat(i) for i in range(2)])
    claims = _claim("w1")
    first, second = claims
    with transaction() as session:
        tenant_id = session.get(Batch, batch_id).tenant_id  # type: ignore[union-attr]
        pause_batch(session, tenant_id=tenant_id, batch_id=batch_id)
    with transaction() as session:  # the reaper re-queues them (w1 looked gone); not taken back: paused
        assert release_worker_leases(session, worker_ids=["w1"], max_attempts=5) == 2
    with transaction() as session:  # the worker's next renewal finds both leases gone and stores what it had
        checkpoints = {first: Generated(claims[first], [9] * 50), second: Generated(claims[second], [8] * 20)}
        assert save(session, checkpoints=checkpoints) == {first, second}
    with transaction() as session:
        resume_batch(session, tenant_id=tenant_id, batch_id=batch_id)
    again = {row.id: row for row in _claimed("w2", 2)}
    assert {rid: list(row.checkpoint) for rid, row in again.items()} == {first: [9] * 50, second: [8] * 20}
    late = {first: Generated(claims[first], [9] * 80)}
    with transaction() as session:  # leased again: a late write from the first worker is refused
        assert save(session, checkpoints=late) == set()
    with transaction() as session:  # the new worker continues from it and hands it back; still refused
        grown = {first: Generated(again[first].claim_id, [9] * 50 + [5] * 10)}
        assert save(session, checkpoints=grown) == {first}
        release(session, worker_id="w2", request_ids=[first, second])
    with transaction() as session:
        assert save(session, checkpoints=late) == set()
    assert _stored(first) == [9] * 50 + [5] * 10


def test_a_restarted_generation_drops_its_checkpoint_and_stores_the_new_one_from_token_0(backend: Backend) -> None:
    submit_job([chat(0)])
    ((rid, old_claim),) = _claim("w1").items()
    with transaction() as session:
        release(session, worker_id="w1", request_ids=[rid], checkpoints={rid: Generated(old_claim, [4] * 30)})
    (row,) = _claimed("w2")
    assert len(row.checkpoint) == 30
    with transaction() as session:  # an earlier claim's restart is refused; this one's drops the 30 tokens
        assert restart(session, claims={rid: old_claim}) == set()
        assert restart(session, claims={rid: row.claim_id}) == {rid}
    assert _row(rid).checkpoint_tokens == 0 and _chunks(rid) == []
    with transaction() as session:
        assert save(session, checkpoints={rid: Generated(row.claim_id, [6] * 12)}) == {rid}
    assert _chunks(rid) == [(0, [6] * 12)]


def test_a_finished_request_drops_its_checkpoint(backend: Backend) -> None:
    submit_job([chat(i) for i in range(2)])
    claims = _claim("w1")
    rid, other = claims
    with transaction() as session:
        checkpoints = {rid: Generated(claims[rid], list(range(40))), other: Generated(claims[other], [1] * 9)}
        save(session, checkpoints=checkpoints)
        save(session, checkpoints={rid: Generated(claims[rid], list(range(50)))})
        record(session, worker_id="w1", run_id="run_1", outcomes=[Outcome(rid, 200, {"ok": True}, 5, 50, 0.1)])
    row = _row(rid)
    assert (row.status, row.checkpoint_tokens, _chunks(rid)) == ("completed", 0, [])
    assert _stored(other) == [1] * 9  # still running: its checkpoint stays


def _checkpointed(count: int) -> tuple[str, list[str]]:
    """A batch of `count` requests, each claimed by w1 with a checkpoint of 20 tokens (two chunks)."""
    batch_id, _ = submit_job([chat(i) for i in range(count)])
    claims = _claim("w1", count)
    with transaction() as session:
        for size in (10, 20):
            checkpoints = {rid: Generated(claim_id, [3] * size) for rid, claim_id in claims.items()}
            save(session, checkpoints=checkpoints)
    assert [len(_chunks(rid)) for rid in claims] == [2] * count
    return batch_id, list(claims)


def test_a_cancelled_batch_drops_its_rows_checkpoints(backend: Backend) -> None:
    batch_id, ids = _checkpointed(2)
    with transaction() as session:
        release(session, worker_id="w1", request_ids=ids[:1])  # one queued again, one still running
        cancel_batch(session, tenant_id=session.get(Batch, batch_id).tenant_id, batch_id=batch_id)  # type: ignore[union-attr]
    assert _all_chunks() == 0
    assert {_row(rid).checkpoint_tokens for rid in ids} == {0}


def test_an_expired_batch_drops_its_rows_checkpoints(backend: Backend) -> None:
    batch_id, ids = _checkpointed(2)
    with transaction() as session:
        session.execute(update(Batch).where(Batch.id == batch_id).values(expires_at=0))
        assert batch_id in expire_overdue(session)
    assert _all_chunks() == 0 and {_row(rid).status for rid in ids} == {"expired"}


def test_a_request_given_up_after_its_last_attempt_drops_its_checkpoint_and_one_requeued_keeps_it(
    backend: Backend,
) -> None:
    _, ids = _checkpointed(2)
    with transaction() as session:
        session.execute(update(BatchRequest).where(BatchRequest.id == ids[0]).values(attempts=3))
        release_worker_leases(session, worker_ids=["w1"], max_attempts=3)
    assert _row(ids[0]).status == "failed" and _chunks(ids[0]) == []
    assert _row(ids[1]).status == "queued" and _stored(ids[1]) == [3] * 20


def test_the_checkpoints_of_a_deleted_batchs_rows_go_with_the_next_sweep_and_no_open_rows_do(backend: Backend) -> None:
    batch_id, _ = _checkpointed(2)
    _, kept = _checkpointed(1)
    with transaction() as session:
        session.execute(delete(Batch).where(Batch.id == batch_id))
    assert _all_chunks() == 2 * 2 + 2  # no foreign key: nothing cascades (a check would lock the queue row)
    with transaction() as session:
        assert sweep(session) == 2 + 2 * 2  # two counts, four chunks
        assert sweep(session) == 0
        assert set(session.scalars(select(Checkpoint.request_id))) == set(kept)
    assert _all_chunks() == 2 and _stored(kept[0]) == [3] * 20


def test_a_chunk_whose_write_raced_the_end_of_its_row_goes_with_the_next_sweep(backend: Backend) -> None:
    _, (rid, other) = _checkpointed(2)
    with transaction() as session:  # what a write that committed while the ending statement waited leaves
        record(session, worker_id="w1", run_id="run_1", outcomes=[Outcome(rid, 200, {"ok": True}, 5, 20, 0.1)])
        session.execute(insert(CheckpointChunk).values(request_id=rid, start=20, token_ids=pack_tokens([4])))
    assert len(_chunks(rid)) == 1
    with transaction() as session:
        assert sweep(session) == 1
    assert _chunks(rid) == [] and _stored(other) == [3] * 20


def test_checkpoints_lost_with_the_database_start_their_generations_again_from_token_0(backend: Backend) -> None:
    """A Postgres crash or failover empties the unlogged checkpoint tables: the next claim finds none, decodes from
    the start, and its answer is recorded once like any other."""
    _, ids = _checkpointed(2)
    with transaction() as session:
        release(session, worker_id="w1", request_ids=ids)
        session.execute(delete(CheckpointChunk))
        session.execute(delete(Checkpoint))
    again = _claimed("w2", 2)
    assert [row.checkpoint for row in again] == [(), ()]
    with transaction() as session:
        assert save(session, checkpoints={again[0].id: Generated(again[0].claim_id, [7] * 4)}) == {again[0].id}
        outcomes = [Outcome(row.id, 200, {"ok": True}, 5, 20, 0.1) for row in again]
        assert sum(record(session, worker_id="w2", run_id="run_2", outcomes=outcomes).values()) == 2
    assert _all_chunks() == 0


@pytest.mark.parametrize("backend", ["postgres"], indirect=True)
def test_the_checkpoint_tables_write_no_wal_on_postgres(backend: Backend) -> None:
    with transaction() as session:
        persistence = dict(
            session.execute(
                text(
                    "SELECT relname, relpersistence FROM pg_class WHERE relname IN ('checkpoints', 'checkpoint_chunks')"
                )
            ).all()
        )
    assert persistence == {"checkpoints": "u", "checkpoint_chunks": "u"}
