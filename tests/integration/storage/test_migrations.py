"""The Alembic-migrated schema matches the ORM models, on SQLite and on Postgres."""

from __future__ import annotations

import json

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.config import Config
from alembic.migration import MigrationContext
from sqlalchemy import text

from storage.db import get_engine, transaction
from storage.models import Base
from storage.queue.checkpoints import pack_tokens
from storage.queue.claim import claim
from storage.settings import get_settings
from tests.conftest import Backend
from tests.integration.jobs import chat, submit_job
from worker.cli.migrate import ROOT


def test_migrated_schema_matches_models(backend: Backend) -> None:
    with get_engine().connect() as connection:
        context = MigrationContext.configure(connection, opts={"compare_type": True})
        diff = compare_metadata(context, Base.metadata)
    assert diff == []


@pytest.mark.backfill_env({"BACKFILL_MODELS": json.dumps({"fake-model": {"path": "fake:"}})})
def test_a_checkpoint_stored_before_the_chunks_migration_is_resumed_from_after_it(backend: Backend) -> None:
    config = Config(str(ROOT / "alembic.ini"))
    config.set_main_option("script_location", str(ROOT / "migrations"))
    submit_job([chat(0)])
    generated = [7, 128_000, 3] * 100
    command.downgrade(config, "0017_checkpoints")
    try:
        with get_engine().begin() as connection:  # a row handed back with a whole-list checkpoint, as 0017 kept it
            update = text("UPDATE batch_requests SET checkpoint = :blob, checkpoint_tokens = 300")
            connection.execute(update, {"blob": pack_tokens(generated)})
    finally:
        command.upgrade(config, "head")
    with transaction() as session:
        (row,) = claim(session, settings=get_settings(), model="fake-model", worker_id="w", limit=1, lease_seconds=60)
    assert list(row.checkpoint) == generated


@pytest.mark.backfill_env({"BACKFILL_MODELS": json.dumps({"fake-model": {"path": "fake:"}})})
def test_retry_trees_made_before_the_tree_migration_are_filled_in_by_it(backend: Backend) -> None:
    from tests.integration.storage.batches.test_retry_trees import cancelled, retried

    config = Config(str(ROOT / "alembic.ini"))
    config.set_main_option("script_location", str(ROOT / "migrations"))
    origin, _ = submit_job([chat(i) for i in range(4)])
    cancelled(origin)
    first = retried(origin)
    cancelled(first)
    cancelled(retried(first))  # a chain of two retries, every line re-run twice
    tree_state = text(
        "SELECT r.id, r.superseded, r.latest_copy, r.copy_of, b.retry_root FROM batch_requests r "
        "JOIN batches b ON b.id = r.batch_id ORDER BY r.id"
    )
    with get_engine().begin() as connection:
        before = connection.execute(tree_state).all()
    command.downgrade(config, "0018_checkpoint_chunks")
    command.upgrade(config, "head")
    with get_engine().begin() as connection:
        assert connection.execute(tree_state).all() == before
    assert sum(row[1] for row in before) == 8 and sum(row[2] is not None for row in before) == 4


@pytest.mark.backfill_env({"BACKFILL_MODELS": json.dumps({"fake-model": {"path": "fake:"}})})
def test_rows_running_before_the_lease_table_keep_their_worker_and_lapse_when_their_expiry_did(
    backend: Backend,
) -> None:
    from storage.queue.reaping import release_expired_leases
    from storage.queue.results import Outcome, record

    config = Config(str(ROOT / "alembic.ini"))
    config.set_main_option("script_location", str(ROOT / "migrations"))
    submit_job([chat(i) for i in range(3)])
    command.downgrade(config, "0021_reasoning_tokens")
    try:
        with (
            get_engine().begin() as connection
        ):  # two rows running under w1 (one lapsed), one under w2, as 0021 kept them
            ids = [row for (row,) in connection.execute(text("SELECT id FROM batch_requests ORDER BY line"))]
            running = (
                "UPDATE batch_requests SET status = 'running', lease_owner = :w, lease_expires_at = :e WHERE id = :i"
            )
            connection.execute(
                text(running),
                [
                    {"w": "w1", "e": 9e12, "i": ids[0]},
                    {"w": "w1", "e": 1.0, "i": ids[1]},
                    {"w": "w2", "e": 1.0, "i": ids[2]},
                ],
            )
    finally:
        command.upgrade(config, "head")
    with transaction() as session:
        assert release_expired_leases(session, max_attempts=3) == 1  # w2's lapsed; w1's lease is its latest expiry
    with transaction() as session:  # w1 still holds both: its results land
        outcomes = [Outcome(rid, 200, {"ok": True}, 1, 1, 0.1) for rid in ids[:2]]
        assert sum(record(session, worker_id="w1", run_id="run_1", outcomes=outcomes).values()) == 2


@pytest.mark.backfill_env({"BACKFILL_MODELS": json.dumps({"fake-model": {"path": "fake:"}})})
def test_a_batch_ingested_before_the_prediction_migration_has_none_and_is_never_compared(backend: Backend) -> None:
    from storage.batches.batches import get_batch
    from storage.batches.finish_predictions import finish_error, finish_errors

    config = Config(str(ROOT / "alembic.ini"))
    config.set_main_option("script_location", str(ROOT / "migrations"))
    command.downgrade(config, "0024_workflow")
    try:
        with get_engine().connect() as connection:  # 0024's batches have no predicted finish
            columns = [row[1] for row in connection.execute(text("SELECT * FROM batches LIMIT 0")).cursor.description]
        assert "predicted_finish_at" not in columns
    finally:
        command.upgrade(config, "head")
    old, _ = submit_job([chat(0)])
    with get_engine().begin() as connection:  # as a batch from before 0025 that ended: no prediction
        connection.execute(
            text("UPDATE batches SET predicted_finish_at = NULL, status = 'completed', completed_at = 1")
        )
    new, _ = submit_job([chat(1)])  # ingested after: admission's prediction is kept
    with transaction() as session:
        before, after = (get_batch(session, tenant_id=None, batch_id=batch_id) for batch_id in (old, new))
        assert before.predicted_finish_at is None and finish_error(before) is None
        assert after.predicted_finish_at is not None and after.predicted_finish_at >= after.created_at
        assert finish_errors(session, since=0) == []
