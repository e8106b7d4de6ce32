"""Batch control on the real vLLM engine (tiny model), embedded, through the official openai SDK's generic calls
and the `backfill` CLI (issue 20 §2, §3, §6): a small high-priority batch submitted after a large one finishes
while the large one runs; pausing the large one frees the engine (a background batch runs meanwhile) and stops
its progress at once; resume brings it back; cancel ends every request exactly once."""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from openai.types import Batch
from sqlalchemy import func, select

from tests.conftest import LiveServer, make_key, start_server
from tests.integration.api.helpers import read_lines, to_jsonl, upload, wait_for
from tests.integration.client.terminal import cli_env, run_cli

pytestmark = pytest.mark.vllm


@pytest.fixture
def live(demo_model_path: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[LiveServer]:
    from tests.conftest import configure
    from worker.cli.migrate import migrate_database

    models = {"backfill-demo": {"path": str(demo_model_path), "max_num_seqs": 8, "max_model_len": 1024}}
    env = {
        "BACKFILL_DATA_DIR": str(tmp_path / "data"),
        "BACKFILL_MODELS": json.dumps(models),
        "BACKFILL_TENANT_MAX_PRIORITY": "10",
    }
    configure(monkeypatch, env)
    migrate_database()
    server, stop = start_server(with_worker=True)
    yield server
    stop()


def lines(n: int, max_tokens: int, tag: str) -> list[dict[str, Any]]:
    body = {"model": "backfill-demo", "max_tokens": max_tokens, "ignore_eos": True}
    return [
        {
            "custom_id": f"{tag}{i}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {**body, "messages": [{"role": "user", "content": f"def {tag}{i}():"}]},
        }
        for i in range(n)
    ]


def create(client: openai.OpenAI, rows: list[dict[str, Any]], window: str = "24h", **extra: Any) -> Batch:
    source = upload(client, to_jsonl(rows))
    return client.batches.create(
        input_file_id=source.id,
        endpoint="/v1/chat/completions",
        completion_window=window,  # type: ignore[arg-type]  # Literal["24h"] in the SDK, which sends what it gets
        extra_body=extra or None,
    )


def running_rows(batch_id: str) -> int:
    from storage.db import transaction
    from storage.models import BatchRequest

    with transaction() as session:
        where = (BatchRequest.batch_id == batch_id, BatchRequest.status == "running")
        return int(session.scalar(select(func.count()).where(*where)) or 0)


def test_priority_pause_resume_and_background_on_the_real_engine(live: LiveServer, tmp_path: Path) -> None:
    key = make_key("acme")
    client = live.client(key)
    env = cli_env(live.base_url, key, tmp_path / "client")
    # The first wave is short (it frees the engine's 8 slots soon), the rest far longer than the test.
    large = create(client, lines(8, 24, "large") + lines(48, 900, "long"), priority=-5)
    while running_rows(large.id) == 0:
        time.sleep(0.1)

    small = create(client, lines(6, 16, "small"), priority=10)
    small_done = wait_for(client, small.id, timeout=300)
    assert small_done.status == "completed" and small_done.request_counts.completed == 6  # type: ignore[union-attr]
    assert client.batches.retrieve(large.id).status == "in_progress"  # the large one still runs

    paused = run_cli(["batches", "pause", large.id], env=env, cwd=tmp_path)
    paused_at = time.monotonic()
    assert paused.returncode == 0 and "(paused)" in paused.stdout, paused.stderr
    completed_at_pause = client.batches.retrieve(large.id).request_counts.completed  # type: ignore[union-attr]
    background = create(client, lines(4, 8, "bg"), window="background")
    samples: list[int] = []
    while (bg := client.batches.retrieve(background.id)).status not in {"completed", "failed", "expired"}:
        samples.append(running_rows(large.id))
        time.sleep(0.2)
    engine_freed_seconds = time.monotonic() - paused_at
    still = client.batches.retrieve(large.id)

    assert bg.status == "completed" and bg.expires_at is None and bg.request_counts.completed == 4  # type: ignore[union-attr]
    # No claim of the paused batch after the pause: rows still running go back at their worker's next renewal
    # (a pause leaves them to their holder, decision 0017), so the count only falls, to 0.
    assert all(later <= earlier for earlier, later in itertools.pairwise(samples))
    assert not samples or samples[-1] == 0
    assert still.status == "in_progress" and still.model_extra and still.model_extra["paused_at"]
    assert still.request_counts.completed == completed_at_pause  # type: ignore[union-attr]  # no progress
    print(f"pause -> background batch done: {engine_freed_seconds:.1f} s; samples {len(samples)}")

    resumed = client.post(f"/batches/{large.id}/resume", body={}, cast_to=Batch)
    assert resumed.model_extra and resumed.model_extra["paused_at"] is None
    while running_rows(large.id) == 0:  # claimed again
        time.sleep(0.1)
    client.batches.cancel(large.id)
    ended = wait_for(client, large.id, timeout=300)
    outputs = [line["custom_id"] for line in read_lines(client, ended.output_file_id)]
    errors = [line["custom_id"] for line in read_lines(client, ended.error_file_id)]
    every = [f"large{i}" for i in range(8)] + [f"long{i}" for i in range(48)]
    assert ended.status == "cancelled" and sorted(outputs + errors) == sorted(every)  # each exactly once
