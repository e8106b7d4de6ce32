"""Recording results in the queue: what the engine says is stored exactly, whatever characters it holds."""

from __future__ import annotations

import json

import pytest
from sqlalchemy import select

from storage.db import transaction
from storage.models import BatchRequest
from storage.queue.claim import claim
from storage.queue.leases import Outcome, record
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
    from storage.batches.batches import cancel_batch
    from storage.models import Batch

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
