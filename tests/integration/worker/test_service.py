"""The worker's unit operations against a real database."""

from __future__ import annotations

import json

import pytest
from sqlalchemy import text

from storage.db import get_engine
from tests.conftest import Backend
from tests.integration.jobs import chat, create_job
from worker import service

pytestmark = pytest.mark.backfill_env({"BACKFILL_MODELS": json.dumps({"fake-model": {"path": "fake:"}})})


def _last_analyze() -> object:
    with get_engine().connect() as connection:
        return connection.execute(
            text("SELECT last_analyze FROM pg_stat_user_tables WHERE relname = 'batch_requests'")
        ).scalar()


def test_a_big_ingest_refreshes_the_queue_statistics_on_postgres(
    backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    if backend.name != "postgres":
        pytest.skip("planner statistics are a Postgres matter")
    monkeypatch.setattr(service, "ANALYZE_AFTER_ROWS", 20)
    before = _last_analyze()
    batch_id = create_job([chat(i) for i in range(25)])
    assert service.ingest(batch_id) == "in_progress"
    after = _last_analyze()
    assert after is not None and after != before
