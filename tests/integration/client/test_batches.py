"""`backfill batches list|show|cancel|results` against the real API: tables by default, --json for scripts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import LiveServer
from tests.integration.api.conftest import FAKE_MODELS
from tests.integration.api.helpers import chat_line, to_jsonl, upload, wait_for

pytestmark = [
    pytest.mark.parametrize("backend", ["embedded"], indirect=True),
    pytest.mark.backfill_env({"BACKFILL_MODELS": FAKE_MODELS}),
]


def finished_batch(server: LiveServer, key: str, lines: int = 2) -> str:
    client = server.client(key)
    source = upload(client, to_jsonl([chat_line(i) for i in range(lines)]))
    batch = client.batches.create(input_file_id=source.id, endpoint="/v1/chat/completions", completion_window="24h")
    return str(wait_for(client, batch.id).id)


def test_batches_list_show_and_results(cli, server: LiveServer, key: str, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    batch_id = finished_batch(server, key)
    code, out, _ = cli("batches", "list")
    assert code == 0
    header, rule, row = out.splitlines()[:3]
    assert header.split() == ["id", "status", "model", "done/total", "failed", "created", "endpoint"]
    assert set(rule.replace(" ", "")) == {"-"} and row.split()[:5] == [batch_id, "completed", "fake-model", "2/2", "0"]
    code, out, _ = cli("batches", "list", "--json")
    assert code == 0 and [b["id"] for b in json.loads(out)["data"]] == [batch_id]
    code, out, _ = cli("batches", "show", batch_id)
    fields = dict(line.split(None, 1) for line in out.splitlines() if line.split()[0] in {"status", "model", "cost"})
    assert code == 0 and fields["status"] == "completed" and fields["cost"].startswith("billed $")
    code, out, _ = cli("batches", "show", batch_id, "--json")
    assert json.loads(out)["cost"]["discount_pct"] == "50.00"
    code, out, _ = cli("batches", "results", batch_id, "--output", str(tmp_path / "r"))
    assert code == 0 and out.startswith(f"{batch_id} completed · 2 completed, 0 failed of 2")
    assert len((tmp_path / "r" / f"{batch_id}_output.jsonl").read_text().splitlines()) == 2


def test_results_of_a_running_batch_say_so_or_wait(cli, server: LiveServer, key: str, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    client = server.client(key)
    source = upload(client, to_jsonl([chat_line(i, max_tokens=10**8) for i in range(2)]))
    batch = client.batches.create(input_file_id=source.id, endpoint="/v1/chat/completions", completion_window="24h")
    wait_for(client, batch.id, {"in_progress"})
    code, _, err = cli("batches", "results", batch.id)
    assert code == 75 and "is in_progress" in err and "--wait" in err
    assert cli("batches", "cancel", batch.id)[0] == 0
    code, out, _ = cli("batches", "results", batch.id, "--wait", "-o", str(tmp_path))
    assert code == 5 and f"{batch.id} cancelled" in out and (tmp_path / f"{batch.id}_errors.jsonl").is_file()


@pytest.mark.backfill_env({"BACKFILL_MODELS": FAKE_MODELS, "BACKFILL_TENANT_MAX_PRIORITY": "10"})
def test_batches_pause_resume_and_priority(cli, server: LiveServer, key: str, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    jobs = tmp_path / "jobs.jsonl"
    jobs.write_bytes(to_jsonl([chat_line(i, max_tokens=10**8) for i in range(2)]))
    code, out, _ = cli("submit", str(jobs), "--priority", "5")
    batch_id = out.strip()
    assert code == 0 and json.loads(cli("batches", "show", batch_id, "--json")[1])["priority"] == 5
    code, out, _ = cli("batches", "pause", batch_id)
    assert code == 0 and out.strip() == f"{batch_id} in_progress (paused) priority 5"
    fields = dict(line.split(None, 1) for line in cli("batches", "show", batch_id)[1].splitlines())
    assert fields["status"] == "in_progress" and "paused" in fields
    code, out, _ = cli("batches", "priority", batch_id, "-3")
    assert code == 0 and out.strip() == f"{batch_id} in_progress (paused) priority -3"
    code, _, err = cli("batches", "priority", batch_id, "11")
    assert code != 0 and "up to 10" in err
    code, out, _ = cli("batches", "resume", batch_id)
    assert code == 0 and out.strip() == f"{batch_id} in_progress priority -3"
    assert cli("batches", "cancel", batch_id)[0] == 0
