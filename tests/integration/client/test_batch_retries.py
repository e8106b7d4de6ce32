"""`backfill batches results --follow|--merged` and `backfill batches retry` against the real API."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from client import batch_retries
from tests.conftest import LiveServer
from tests.integration.api.conftest import FAKE_MODELS
from tests.integration.api.helpers import chat_line, to_jsonl, upload, wait_for
from worker.cli.main import main

pytestmark = [
    pytest.mark.parametrize("backend", ["embedded"], indirect=True),
    pytest.mark.backfill_env({"BACKFILL_MODELS": FAKE_MODELS}),
]


def test_follow_appends_lines_as_they_land_then_retry_and_merged_give_every_request_once(  # type: ignore[no-untyped-def]
    cli, server: LiveServer, key: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(batch_retries, "FOLLOW_SECONDS", 0.1)
    client = server.client(key)
    lines = [chat_line(i, max_tokens=2 if i < 2 else 2000) for i in range(4)]
    batch = client.batches.create(
        input_file_id=upload(client, to_jsonl(lines)).id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    followed = tmp_path / "followed.jsonl"
    exit_codes: list[int] = []
    follower = threading.Thread(
        target=lambda: exit_codes.append(main(["batches", "results", batch.id, "--follow", "-o", str(followed)]))
    )
    follower.start()
    deadline = time.time() + 30
    while time.time() < deadline and not (followed.is_file() and len(followed.read_text().splitlines()) >= 2):
        time.sleep(0.05)
    assert len(followed.read_text().splitlines()) == 2  # the two quick ones, while the batch runs
    client.batches.cancel(batch.id)
    follower.join(30)
    assert exit_codes == [5]  # it followed the batch to its end: cancelled
    seen = [json.loads(line)["custom_id"] for line in followed.read_text().splitlines()]
    assert sorted(seen) == [f"req-{i}" for i in range(4)]  # each once

    code, out, _ = cli("batches", "retry", batch.id, "--wait")
    assert code == 0 and f"retry of {batch.id}, 2 requests" in out, out
    assert client.batches.retrieve(batch.id).model_extra["retries"]  # type: ignore[index]
    code, _, err = cli("batches", "results", batch.id, "--merged", "-o", str(tmp_path))
    merged = [json.loads(line) for line in (tmp_path / f"{batch.id}_merged.jsonl").read_text().splitlines()]
    assert code == 5 and "4 lines" in err  # the exit code is the origin's end state
    assert [line["custom_id"] for line in merged] == [f"req-{i}" for i in range(4)]
    assert all(line["response"]["status_code"] == 200 for line in merged)
    wait_for(client, batch.id)
