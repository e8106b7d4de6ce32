"""What one claim sends to the database (issue 41: a claim's statements at fleet scale, bench/claim_profile.py)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator

import pytest
from sqlalchemy import event, update

from storage.db import get_engine, transaction
from storage.models import Batch
from storage.queue.claim import claim
from storage.queue.claim_order import drain_cache
from storage.settings import get_settings
from tests.conftest import Backend
from tests.integration.jobs import chat, submit_job

pytestmark = pytest.mark.backfill_env({"BACKFILL_MODELS": json.dumps({"fake-model": {"path": "fake:"}})})


@pytest.fixture
def statements() -> Iterator[list[str]]:
    drain_cache.clear()
    seen: list[str] = []

    def record(*args: object) -> None:
        seen.append(str(args[2]))

    event.listen(get_engine(), "before_cursor_execute", record)
    yield seen
    event.remove(get_engine(), "before_cursor_execute", record)
    drain_cache.clear()


def cut_reads(statements: list[str]) -> list[str]:
    return [s for s in statements if "max(checkpoints.tokens)" in s]  # which queued rows hold a checkpoint


def test_a_claim_with_no_batch_past_its_window_does_not_look_for_rows_to_cut(
    backend: Backend, statements: list[str]
) -> None:
    submit_job([chat(i) for i in range(6)])
    statements.clear()
    with transaction() as session:
        claimed = claim(session, model="fake-model", worker_id="w", limit=4, lease_seconds=60, settings=get_settings())
    assert len(claimed) == 4
    assert cut_reads(statements) == []


def test_a_claim_with_a_batch_past_its_window_looks_for_rows_to_cut(backend: Backend, statements: list[str]) -> None:
    batch_id, _ = submit_job([chat(i) for i in range(6)])
    with transaction() as session:
        session.execute(update(Batch).where(Batch.id == batch_id).values(expires_at=1))
    statements.clear()
    with transaction() as session:
        claim(session, model="fake-model", worker_id="w", limit=4, lease_seconds=60, settings=get_settings())
    assert len(cut_reads(statements)) == 1


@pytest.mark.parametrize("backend", ["postgres"], indirect=True)  # SQLite reads which batches are capped afterwards
def test_a_claim_reads_the_batches_once(backend: Backend, statements: list[str]) -> None:
    """Their bands, caps and checks from one read: the checks are not read again for the rows claimed."""
    submit_job([chat(i) for i in range(6)])
    statements.clear()
    with transaction() as session:
        claimed = claim(session, model="fake-model", worker_id="w", limit=4, lease_seconds=60, settings=get_settings())
    assert len(claimed) == 4
    assert len([s for s in statements if s.startswith("SELECT") and re.search(r"\bFROM batches\b", s)]) == 1
