"""The workflow (docs/workflow.md) through the `backfill` client commands on the fake engine: `submit --wait` stops at
a trial's report and `batches resume --wait` runs the rest; checks with `--max-attempts` and each line's attempts in
`batches attempts` and the summary; `submit --estimate` prints the menu of windows and creates nothing. The same on
the real engine: tests/e2e/test_cli_workflow.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import LiveServer
from tests.integration.api.conftest import FAKE_MODELS
from tests.integration.api.helpers import chat_line, to_jsonl
from tests.integration.client.terminal import run_cli
from tests.integration.client.test_batch_outcomes import fields

WINDOWS = {"1h": "0.2", "24h": "0.5", "background": "0.6"}
pytestmark = [
    pytest.mark.parametrize("backend", ["embedded"], indirect=True),  # the client's view: one backend is enough
    pytest.mark.backfill_env({"BACKFILL_MODELS": FAKE_MODELS, "BACKFILL_COMPLETION_WINDOWS": json.dumps(WINDOWS)}),
]


def job(path: Path, count: int, **body: Any) -> Path:
    path.write_bytes(to_jsonl([chat_line(i, max_tokens=1, **body) for i in range(count)]))
    return path


def results(server: LiveServer, key: str, batch_id: str) -> dict[str, dict[str, Any]]:
    text = server.client(key).get(f"/batches/{batch_id}/results", cast_to=str)
    return {line["custom_id"]: line for line in map(json.loads, text.splitlines())}


def test_submit_wait_stops_at_the_trial_report_and_resume_wait_runs_the_rest(  # type: ignore[no-untyped-def]
    cli, server: LiveServer, key: str, tmp_path: Path
) -> None:
    jobs = job(tmp_path / "jobs.jsonl", 12)
    code, out, err = cli("submit", str(jobs), "--trial", '{"lines": 3}', "--wait", "-o", str(tmp_path))
    assert code == 75, err  # not finished: paused by its trial, waiting for a person
    batch_id = out.splitlines()[0].split()[0]
    batch = server.client(key).batches.retrieve(batch_id)
    report = (batch.model_extra or {})["trial"]["report"]
    cost = report["projected_cost"]
    assert f"{batch_id} paused after its trial:" in out
    said = dict(line.strip().split("  ", 1) for line in out.splitlines() if line.startswith("  "))
    said = {name: value.strip() for name, value in said.items()}
    assert said["lines run"] == "3 of 12" and said["success"] == "100% (3 succeeded)"
    interval = f"(95%: ${cost['low_usd']} to ${cost['high_usd']}); the trial cost ${cost['trial_usd']}"
    assert said["projected"] == f"${cost['estimate_usd']} for the whole batch {interval}"
    assert f"backfill batches resume {batch_id} --wait" in out and f"backfill batches cancel {batch_id}" in out
    assert not list(tmp_path.glob("batch_*"))  # nothing downloaded: the batch has not ended

    code, out, _ = cli("batches", "show", batch_id)
    shown = {name.strip(): value.strip() for name, value in fields(out).items()}
    assert shown["trial"] == "3 lines first, then pauses (manual) · reported"
    assert shown["trial decision"] == "paused: resume to run the rest, or cancel"
    assert shown["trial projected"].startswith(f"${cost['estimate_usd']} for the whole batch")

    code, out, err = cli("batches", "resume", batch_id, "--wait", "-o", str(tmp_path))
    assert code == 0, err
    assert f"{batch_id} completed · 12 completed, 0 failed of 12" in out
    assert len((tmp_path / f"{batch_id}_output.jsonl").read_text().splitlines()) == 12  # the trial's 3 ran once


def test_checks_with_max_attempts_show_each_lines_attempts_a_page_at_a_time(  # type: ignore[no-untyped-def]
    cli, server: LiveServer, key: str, env: dict[str, str], tmp_path: Path
) -> None:
    jobs = job(tmp_path / "jobs.jsonl", 12)
    checks = '{"regex": "lorem|ipsum"}'
    code, out, err = cli("submit", str(jobs), "--checks", checks, "--max-attempts", "4", "--wait", "-o", str(tmp_path))
    assert code == 0, err
    batch_id = out.split()[0]
    assert (server.client(key).batches.retrieve(batch_id).model_extra or {})["checks"]["max_attempts"] == 4
    lines = results(server, key, batch_id)
    first = sum(1 for line in lines.values() if line["attempts"]["count"] == 1 and line["error"] is None)
    again = sum(1 for line in lines.values() if line["attempts"]["count"] > 1 and line["error"] is None)
    failed = sum(1 for line in lines.values() if line["error"] is not None)
    assert again + failed > 0  # the fake draws other words on a new seed: some lines needed a redraw
    summary = out.strip().splitlines()[-1]
    assert f"checks: {first} passed at the first draw, {again} drawn again, {failed} failed every draw" in summary

    code, page_one, err = cli("batches", "attempts", batch_id, "--limit", "5")
    assert code == 0 and "more: backfill batches attempts" in err
    cursor = err.split("--after ")[1].split()[0]
    code, page_two, _ = cli("batches", "attempts", batch_id, "--limit", "10", "--after", cursor)
    rows = [line.split() for text in (page_one, page_two) for line in text.splitlines()[2:]]
    assert sorted(row[0] for row in rows) == sorted(lines)  # every line once over the two pages
    for row in rows:
        line = lines[row[0]]
        assert row[1] == ("answered" if line["error"] is None else "checks_failed")
        assert int(row[2]) == line["attempts"]["count"]
        assert row[3:4] == ["none"] if line["attempts"]["count"] == 1 else row[3] == "1:"

    refused = run_cli(["submit", str(jobs), "--max-attempts", "6"], env=env, cwd=tmp_path)  # argparse exits
    assert refused.returncode == 2 and "--max-attempts: must be between 1 and 5, got 6" in refused.stderr
    code, _, err = cli("submit", str(jobs), "--checks", '{"max_attempts": 2}', "--max-attempts", "3")
    assert code == 2 and "give one" in err


def test_submit_estimate_prints_every_window_and_creates_nothing(  # type: ignore[no-untyped-def]
    cli, server: LiveServer, key: str, tmp_path: Path
) -> None:
    jobs = job(tmp_path / "jobs.jsonl", 4)
    code, out, err = cli("submit", str(jobs), "--estimate")
    assert code == 0, err
    menu = {line.split()[0]: line for line in out.splitlines() if line.split()[:1] in (["1h"], ["24h"], ["background"])}
    assert list(menu) == ["1h", "24h", "background"]
    assert "20%" in menu["1h"] and "50%" in menu["24h"] and "60%" in menu["background"]
    assert "none (background)" in menu["background"] and menu["24h"].rstrip().endswith(("yes", ")"))
    assert "--window 1h" in err  # how to submit on the first window it admits
    client = server.client(key)
    assert client.batches.list().data == [] and client.files.list().data == []  # nothing created, nothing left

    code, out, _ = cli("submit", str(jobs), "--estimate", "--json")
    assert code == 0 and [w["completion_window"] for w in json.loads(out)["windows"]] == ["1h", "24h", "background"]
    code, out, err = cli("submit", str(jobs), "--window", "1h")
    assert code == 0, err
    assert client.batches.retrieve(out.strip()).completion_window == "1h"


@pytest.mark.backfill_env(
    {
        "BACKFILL_MODELS": FAKE_MODELS,
        "BACKFILL_COMPLETION_WINDOWS": json.dumps(WINDOWS),
        "BACKFILL_CHECKPOINT_INTERVAL_SECONDS": "0.2",
        "BACKFILL_REAP_INTERVAL_SECONDS": "1",
    }
)
def test_an_expired_batch_that_continues_names_its_background_child(  # type: ignore[no-untyped-def]
    cli, server: LiveServer, key: str, tmp_path: Path
) -> None:
    from tests.e2e.resume import wait_until_checkpointed_mid_decode
    from tests.integration.worker.feed.test_expiry_cuts import window_closes
    from worker.process.service import reap_once

    jobs = tmp_path / "jobs.jsonl"
    jobs.write_bytes(to_jsonl([chat_line(i, max_tokens=10**8) for i in range(2)]))  # never finish on their own
    code, out, err = cli("submit", str(jobs), "--on-expiry", "continue_in_background", "--checks", '{"max_length": 9}')
    assert code == 0, err
    origin = out.strip()
    wait_until_checkpointed_mid_decode(origin, alive=lambda: True, timeout=60)
    window_closes(origin)
    reap_once()  # the reaper's pass now: both lines are mid-generation

    code, out, _ = cli("batches", "results", origin, "--wait", "-o", str(tmp_path))
    assert code == 4  # expired
    (child,) = (server.client(key).batches.retrieve(origin).model_extra or {})["retries"]
    assert (
        f"its unfinished lines continue in the background in {child}: `backfill batches results {child} --wait`" in out
    )
    code, out, _ = cli("batches", "show", origin)
    rows = {name.strip(): value.strip() for name, value in fields(out).items()}
    assert rows["on expiry"] == "unfinished lines continue in the background (a child batch)"
    assert rows["checks"] == "the line's own schema · at most 9 characters · 3 draws at most"
    assert rows["retries"] == child
    cli("batches", "cancel", child)  # its lines would never finish
