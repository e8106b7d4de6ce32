"""The issue's closing scenario on the real vLLM engine (tiny model), embedded: a person at a terminal registers
a webhook and runs `backfill submit jobs.jsonl --wait`; the bar moves, the results land on disk, and the
receiver gets `batch.completed`, which the official openai SDK verifies."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from openai.types.chat import ChatCompletion
from openai.types.webhooks import BatchCompletedWebhookEvent

from tests.conftest import LiveServer, make_key, start_server
from tests.integration.client.terminal import Terminal, cli_env, run_cli
from tests.integration.receiver import WEBHOOK_TEST_ENV, running_receiver

pytestmark = pytest.mark.vllm


@pytest.fixture
def live(demo_model_path: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[LiveServer]:
    from tests.conftest import configure
    from worker.cli.migrate import migrate_database

    models = {"backfill-demo": {"path": str(demo_model_path), "max_num_seqs": 8, "max_model_len": 1024}}
    configure(
        monkeypatch,
        {"BACKFILL_DATA_DIR": str(tmp_path / "data"), "BACKFILL_MODELS": json.dumps(models), **WEBHOOK_TEST_ENV},
    )
    migrate_database()
    server, stop = start_server(with_worker=True)
    yield server
    stop()


def test_submit_wait_in_a_terminal_with_a_webhook_verified_by_the_openai_sdk(live: LiveServer, tmp_path: Path) -> None:
    key = make_key("acme")
    env = cli_env(live.base_url, key, tmp_path / "client")
    jobs = tmp_path / "jobs.jsonl"
    body = {"model": "backfill-demo", "max_tokens": 48, "ignore_eos": True}
    jobs.write_text(
        "".join(
            json.dumps(
                {
                    "custom_id": f"c{i}",
                    "method": "POST",
                    "url": "/v1/chat/completions",
                    "body": {**body, "messages": [{"role": "user", "content": f"def f{i}():"}]},
                }
            )
            + "\n"
            for i in range(24)
        )
    )
    with running_receiver() as receiver:
        added = run_cli(["webhooks", "add", f"{receiver.url}/backfill"], env=env, cwd=tmp_path)
        assert added.returncode == 0, added.stderr
        secret = added.stdout.strip().splitlines()[-1]
        screen = Terminal(["submit", str(jobs), "--wait", "--output", "results"], env=env, cwd=tmp_path)
        batch_id = screen.expect(r"created (batch_\w+)", timeout=60).group(1)
        assert screen.wait(timeout=300) == 0, screen.text
        [post] = receiver.wait_for(1, timeout=30)
    text = screen.text
    assert re.search(r"upload: 100%", text) and re.search(r"\|\s*24/24 \[", text), text
    assert re.search(rf"{batch_id} completed · 24 completed, 0 failed of 24 · (in [0-9.]+ s · )?billed \$", text), text
    output = (tmp_path / "results" / f"{batch_id}_output.jsonl").read_text().splitlines()
    assert len(output) == 24
    for line in output:
        completion = ChatCompletion.model_validate(json.loads(line)["response"]["body"])
        assert completion.usage is not None and completion.usage.completion_tokens == 48
    event = live.client(key).webhooks.unwrap(post.body, post.headers, secret=secret)
    assert isinstance(event, BatchCompletedWebhookEvent) and event.data.id == batch_id
