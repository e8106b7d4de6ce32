"""Recording results in the queue: what the engine says is stored exactly, whatever characters it holds."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session

from storage.batches.control import pause_batch
from storage.db import transaction
from storage.models import Batch, BatchRequest, Checkpoint, CheckpointChunk, Tenant
from storage.queue.backlog import done_batches
from storage.queue.claim import claim
from storage.queue.enqueue import lock_batches_of
from storage.queue.results import Outcome, record, record_outcomes
from storage.settings import get_settings
from tests.conftest import Backend
from tests.integration.jobs import chat, submit_job

pytestmark = pytest.mark.backfill_env({"BACKFILL_MODELS": json.dumps({"fake-model": {"path": "fake:"}})})


def test_results_with_nul_characters_are_stored_verbatim(backend: Backend) -> None:
    """A random-weight model can emit U+0000; Postgres' json keeps it, its text type cannot hold it."""
    batch_id, status = submit_job([chat(i) for i in range(3)])
    assert status == "in_progress"
    with transaction() as session:
        claimed = claim(session, settings=get_settings(), model="fake-model", worker_id="w", limit=3, lease_seconds=60)
    body = {"choices": [{"message": {"content": "a\u0000b \u2603"}}], "usage": {"completion_tokens": 2}}
    outcomes = [
        Outcome(claimed[0].id, 200, body, 5, 2, 0.1),
        Outcome(claimed[1].id, 200, {"plain": True}, 5, 2, 0.1),
        Outcome(claimed[2].id, 400, {"error": {"message": "bad\u0000"}}, 0, 0, 0.0, "invalid_value", "bad\u0000"),
    ]
    with transaction() as session:
        stored = record(session, worker_id="w", run_id="run_1", outcomes=outcomes)
    assert stored == {batch_id: 3}
    with transaction() as session:
        rows = {r.id: r for r in session.scalars(select(BatchRequest).where(BatchRequest.batch_id == batch_id))}
    assert rows[claimed[0].id].response_body == body and rows[claimed[0].id].status == "completed"
    assert rows[claimed[1].id].response_body == {"plain": True}
    failed = rows[claimed[2].id]
    assert failed.status == "failed" and failed.response_body == {"error": {"message": "bad\u0000"}}
    assert failed.error_message is not None and failed.error_message.startswith("bad")


def test_requests_cancelled_while_a_worker_picks_them_are_not_run(
    backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 19 bug 2: on SQLite a cancel could commit between the claim's pick and its lease; the lease then
    ran the cancelled rows and their results counted too (canceled 60 and succeeded 60 for 60 requests)."""
    import threading

    import storage.queue.claim as claim_module
    from storage.batches.control import cancel_batch

    batch_id, _ = submit_job([chat(i) for i in range(5)])
    with transaction() as session:
        tenant_id = session.get(Batch, batch_id).tenant_id  # type: ignore[union-attr]
    pick = claim_module.pick

    def pick_then_cancel(*args: object, **kwargs: object) -> list[str]:
        ids = pick(*args, **kwargs)  # type: ignore[arg-type]

        def cancel() -> None:
            with transaction() as session:
                cancel_batch(session, tenant_id=tenant_id, batch_id=batch_id)

        # Postgres: the picked rows are locked until the claim commits, so the cancel waits (stop waiting);
        # SQLite: it commits now, between the pick and the lease.
        cancelling = threading.Thread(target=cancel)
        cancelling.start()
        cancelling.join(3)
        threads.append(cancelling)
        return ids

    threads: list[threading.Thread] = []
    monkeypatch.setattr(claim_module, "pick", pick_then_cancel)
    with transaction() as session:
        claimed = claim(session, settings=get_settings(), model="fake-model", worker_id="w", limit=5, lease_seconds=60)
    for thread in threads:
        thread.join(30)
    outcomes = [Outcome(item.id, 200, {"ok": True}, 5, 2, 0.1) for item in claimed]
    with transaction() as session:
        record(session, worker_id="w", run_id="run_1", outcomes=outcomes)
        batch = session.get(Batch, batch_id)
        statuses = list(session.scalars(select(BatchRequest.status).where(BatchRequest.batch_id == batch_id)))
    assert batch is not None and batch.status == "cancelling"
    assert statuses == ["cancelled"] * 5
    assert (batch.request_completed, batch.request_failed, batch.request_cancelled) == (0, 5, 5)


def _statements_during(work: Callable[[Session], object]) -> list[str]:
    """The SQL `work` sends in one transaction, in order."""
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


def test_a_flush_across_a_paused_and_a_running_batch_hands_back_one_and_stores_the_other(backend: Backend) -> None:
    """The lock reads which batches are paused; when one is, its rows still go back unrecorded and the others land."""
    running, _ = submit_job([chat(i) for i in range(2)], tenant="a")
    paused, _ = submit_job([chat(i) for i in range(2)], tenant="b")
    with transaction() as session:
        claimed = claim(session, settings=get_settings(), model="fake-model", worker_id="w", limit=4, lease_seconds=60)
        tenant_of = {b.id: b.tenant_id for b in session.scalars(select(Batch))}
    assert {item.batch_id for item in claimed} == {running, paused}
    with transaction() as session:
        pause_batch(session, tenant_id=tenant_of[paused], batch_id=paused)
    outcomes = [Outcome(item.id, 200, {"ok": True}, 5, 2, 0.1) for item in claimed]
    with transaction() as session:
        recorded = record_outcomes(session, worker_id="w", run_id="run_1", outcomes=outcomes)
    assert recorded.batches == {running: 2}
    assert recorded.stored == {item.id for item in claimed if item.batch_id == running}
    with transaction() as session:
        rows = session.execute(select(BatchRequest.batch_id, BatchRequest.status, BatchRequest.lease_owner)).all()
    assert sorted(rows) == sorted([(running, "completed", None)] * 2 + [(paused, "queued", None)] * 2)


def test_the_batch_lock_tells_paused_and_capped_batches_apart(backend: Backend) -> None:
    plain, _ = submit_job([chat(0)], tenant="a")
    capped, _ = submit_job([chat(1)], tenant="b")
    budgeted, _ = submit_job([chat(2)], tenant="c")
    paused, _ = submit_job([chat(3)], tenant="d")
    with transaction() as session:
        claimed = claim(session, settings=get_settings(), model="fake-model", worker_id="w", limit=4, lease_seconds=60)
        batches = {b.id: b for b in session.scalars(select(Batch))}
        batches[capped].max_cost_micro_usd = 1_000_000
        session.get(Tenant, batches[budgeted].tenant_id).monthly_budget_micro_usd = 5_000_000  # type: ignore[union-attr]
        pause_batch(session, tenant_id=batches[paused].tenant_id, batch_id=paused)
    with transaction() as session:
        locked = lock_batches_of(session, request_ids=[item.id for item in claimed])
    if backend.name == "postgres":  # exact: the lock holds both facts until commit
        assert (locked.paused, locked.capped) == ({paused}, {capped, budgeted})
    else:  # SQLite's read is no lock: every batch may be either, so nothing is left out
        assert locked.paused == locked.capped == {plain, capped, budgeted, paused}


def test_results_of_batches_with_nothing_paused_or_capped_send_no_statement_for_either(backend: Backend) -> None:
    """Postgres: a flush is the batch lock, one statement storing the results (and dropping their checkpoints),
    the batch counts; the hand-back of paused rows and the spend-cap check send nothing when they have nothing to do."""
    if backend.name != "postgres":
        pytest.skip("SQLite's lock tells nothing: every step runs there")
    submit_job([chat(i) for i in range(3)])
    with transaction() as session:
        claimed = claim(session, settings=get_settings(), model="fake-model", worker_id="w", limit=3, lease_seconds=60)
    outcomes = [Outcome(item.id, 200, {"ok": True}, 5, 2, 0.1) for item in claimed]
    sent = _statements_during(lambda s: record_outcomes(s, worker_id="w", run_id="run_1", outcomes=outcomes))
    assert [statement.split()[0] for statement in sent] == ["SELECT", "WITH", "UPDATE"]
    assert "FOR UPDATE OF batches" in sent[0] and sent[2].startswith("UPDATE batches")


def test_a_stored_result_drops_its_rows_checkpoint_in_the_same_statement(backend: Backend) -> None:
    from storage.queue.checkpoints import Generated, save

    submit_job([chat(i) for i in range(2)])
    with transaction() as session:
        claimed = claim(session, settings=get_settings(), model="fake-model", worker_id="w", limit=2, lease_seconds=60)
        save(session, checkpoints={i.id: Generated(i.claim_id, [1, 2, 3]) for i in claimed})
    with transaction() as session:
        assert len(list(session.scalars(select(CheckpointChunk.request_id)))) == 2
    with transaction() as session:
        record(session, worker_id="w", run_id="run_1", outcomes=[Outcome(claimed[0].id, 200, {"ok": True}, 5, 2, 0.1)])
    with transaction() as session:
        assert list(session.scalars(select(CheckpointChunk.request_id))) == [claimed[1].id]  # still running: kept
        assert session.get(BatchRequest, claimed[0].id).checkpoint_tokens == 0  # type: ignore[union-attr]
        assert list(session.scalars(select(Checkpoint.request_id))) == [claimed[1].id]


def test_done_batches_are_those_with_nothing_queued_or_running_in_the_order_given(backend: Backend) -> None:
    first, _ = submit_job([chat(0)], tenant="a")
    second, _ = submit_job([chat(1), chat(2)], tenant="b")
    third, _ = submit_job([chat(3)], tenant="c")
    with transaction() as session:
        claimed = claim(session, settings=get_settings(), model="fake-model", worker_id="w", limit=4, lease_seconds=60)
    ends = [item for item in claimed if item.batch_id != second] + [next(i for i in claimed if i.batch_id == second)]
    with transaction() as session:
        record(session, worker_id="w", run_id="run_1", outcomes=[Outcome(i.id, 200, {}, 1, 1, 0.1) for i in ends])
    with transaction() as session:
        assert done_batches(session, batch_ids=[third, second, first]) == [third, first]
        assert done_batches(session, batch_ids=[]) == []


def test_a_claim_marks_the_rows_of_capped_batches_and_budgeted_tenants(backend: Backend) -> None:
    """The runner hands a capped row's result over at once (docs/decisions/0018): the claim says which are."""
    plain, _ = submit_job([chat(0)], tenant="a")
    capped, _ = submit_job([chat(1)], tenant="b")
    budgeted, _ = submit_job([chat(2)], tenant="c")
    with transaction() as session:
        batches = {b.id: b for b in session.scalars(select(Batch))}
        batches[capped].max_cost_micro_usd = 1_000_000
        session.get(Tenant, batches[budgeted].tenant_id).monthly_budget_micro_usd = 5_000_000  # type: ignore[union-attr]
    with transaction() as session:
        claimed = claim(session, settings=get_settings(), model="fake-model", worker_id="w", limit=3, lease_seconds=60)
    assert {item.batch_id: item.capped for item in claimed} == {plain: False, capped: True, budgeted: True}
