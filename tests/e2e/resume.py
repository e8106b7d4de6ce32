"""Shared by the resume and expiry e2e tests: greedy lines, the queue rows' checkpoints, the answers to compare,
the checkpointing server on the demo model and the window closing."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select, update

from tests.conftest import LiveServer

# Requests interrupted mid-decode. The engine runs 4 at a time, so 12 requests of 192 tokens (3 waves of 192
# steps, ~6 s on the demo model) keep the batch running well past the first periodic checkpoint: every 8 tokens,
# looked for with each lease renewal (at most every 2 s).
REQUESTS = 12
MAX_TOKENS = 192
CHECKPOINT_ENV = {"BACKFILL_CHECKPOINT_EVERY_TOKENS": "8", "BACKFILL_CHECKPOINT_INTERVAL_SECONDS": "0.1"}
# The expiry tests' lines: long enough (about 10 s a wave of 4 on the demo model) that the lines mid-decode when
# the window closes are still mid-decode at their worker's next renewal (every 2 s), whatever the machine's load.
EXPIRY_MAX_TOKENS = 960


def greedy_lines(prefix: str) -> list[dict[str, Any]]:
    """Greedy chat lines of fixed length (ignore_eos), so every interruption point lies inside the generation."""
    return [
        {
            "custom_id": f"{prefix}{i}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {
                "model": "backfill-demo",
                "messages": [{"role": "user", "content": f"Write function number {i}."}],
                "max_tokens": MAX_TOKENS,
                "temperature": 0,
                "ignore_eos": True,
            },
        }
        for i in range(REQUESTS)
    ]


def rows_of(batch_id: str) -> dict[str, tuple[str, int]]:
    """Each request's (status, checkpoint_tokens), by custom_id, as the database has them now."""
    from storage.db import transaction
    from storage.models import BatchRequest

    query = select(BatchRequest.custom_id, BatchRequest.status, BatchRequest.checkpoint_tokens).where(
        BatchRequest.batch_id == batch_id
    )
    with transaction() as session:
        return {custom_id: (status, tokens) for custom_id, status, tokens in session.execute(query)}


def wait_until_checkpointed_mid_decode(batch_id: str, *, alive: Callable[[], bool], timeout: float = 420) -> None:
    """Until a request still running has a periodic checkpoint: tokens are generated and the batch is not done."""
    deadline = time.monotonic() + timeout
    while True:
        rows = rows_of(batch_id)
        if any(status == "running" and tokens > 0 for status, tokens in rows.values()):
            return
        assert alive(), "the worker died before checkpointing"
        assert time.monotonic() < deadline, f"no periodic checkpoint while running: {rows}"
        assert not rows or {status for status, _ in rows.values()} != {"completed"}, "done with no checkpoint"
        time.sleep(0.05)


def answers(outputs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """What must not depend on an interruption: each line's choices (text, finish reason) and usage."""
    return {line["custom_id"]: {key: line["response"]["body"][key] for key in ("choices", "usage")} for line in outputs}


@contextmanager
def checkpointing_server(
    demo_model_path: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> Iterator[LiveServer]:
    """The API with its embedded worker on the demo model (float32, 4 at a time), checkpointing every 8 tokens."""
    from tests.conftest import configure, start_server
    from worker.cli.migrate import migrate_database

    models = {
        "backfill-demo": {"path": str(demo_model_path), "max_num_seqs": 4, "max_model_len": 1024, "dtype": "float32"}
    }
    env = {"BACKFILL_DATA_DIR": str(tmp_path / "data"), "BACKFILL_MODELS": json.dumps(models), **CHECKPOINT_ENV}
    configure(monkeypatch, env)
    migrate_database()
    server, stop = start_server(with_worker=True)
    try:
        yield server
    finally:
        stop()


def window_closes(batch_id: str) -> None:
    """The 24 hours are up (the batch's and its rows' deadlines moved to a second ago)."""
    from storage.db import transaction
    from storage.models import Batch, BatchRequest

    past = int(time.time()) - 1
    with transaction() as session:
        session.execute(update(Batch).where(Batch.id == batch_id).values(expires_at=past))
        session.execute(update(BatchRequest).where(BatchRequest.batch_id == batch_id).values(deadline=past))
