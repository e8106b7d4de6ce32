"""`backfill submit` in a terminal against the real API: progress bars, Ctrl-C, files on disk, exit codes."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from openai.types import Batch

from tests.conftest import LiveServer
from tests.integration.api.conftest import FAKE_MODELS
from tests.integration.api.helpers import chat_line, to_jsonl
from tests.integration.client.terminal import Terminal, run_cli

# The client does not care where the server keeps its rows: one backend is enough here.
pytestmark = [
    pytest.mark.parametrize("backend", ["embedded"], indirect=True),
    pytest.mark.backfill_env({"BACKFILL_MODELS": FAKE_MODELS}),
]


def job(path: Path, lines: list[dict[str, object]]) -> Path:
    path.write_bytes(to_jsonl(lines))
    return path


def test_submit_wait_shows_progress_then_leaves_the_results_and_a_summary(
    server: LiveServer, key: str, env: dict[str, str], tmp_path: Path
) -> None:
    # 8 requests run at once, 1 ms per token: five waves of ~1.5 s, so the bar moves several times.
    lines = [chat_line(i, max_tokens=1500) for i in range(40)] + [chat_line(40, temperature=-3)]
    source = job(tmp_path / "jobs.jsonl", lines)
    screen = Terminal(
        ["submit", str(source), "--wait", "--output", "results", "--metadata", "team=ml"], env=env, cwd=tmp_path
    )
    screen.expect(r"upload: 100%\|.*\| [\d.]+k?/[\d.]+k? ")
    screen.expect(r"created (batch_\w+)")
    code = screen.wait(timeout=120)
    text = screen.text
    assert code == 0, text
    counts = [int(n) for n in re.findall(r"in_progress:\s+\d+%\|[^|]*\|\s+(\d+)/41", text)]
    assert any(0 < n < 41 for n in counts), f"the bar never showed partial progress:\n{text}"
    assert re.search(r"req/s", text) and re.search(r"\d\d:\d\d<\d\d:\d\d", text)  # throughput and ETA
    batch_id = re.search(r"created (batch_\w+)", text).group(1)  # type: ignore[union-attr]
    summary = next(line for line in text.splitlines() if line.startswith(f"{batch_id} completed"))
    assert "40 completed, 1 failed of 41" in summary and "billed $" in summary and "% off" in summary
    output = tmp_path / "results" / f"{batch_id}_output.jsonl"
    errors = tmp_path / "results" / f"{batch_id}_errors.jsonl"
    assert len(output.read_text().splitlines()) == 40 and len(errors.read_text().splitlines()) == 1
    assert all(json.loads(line)["response"]["status_code"] == 200 for line in output.read_text().splitlines())
    assert server.client(key).batches.retrieve(batch_id).metadata == {"team": "ml"}


def test_ctrl_c_while_waiting_asks_and_yes_cancels_the_batch(
    server: LiveServer, key: str, env: dict[str, str], tmp_path: Path
) -> None:
    source = job(tmp_path / "long.jsonl", [chat_line(i, max_tokens=10**8) for i in range(20)])
    screen = Terminal(["submit", str(source), "--wait", "-o", "out"], env=env, cwd=tmp_path)
    batch_id = screen.expect(r"created (batch_\w+)").group(1)
    screen.expect(r"in_progress:")
    screen.type("\x03")
    screen.expect(rf"Cancel batch {batch_id}\? \[y/N\]")
    screen.type("y\n")
    code = screen.wait(timeout=60)
    assert code == 5, screen.text  # cancelled
    assert f"{batch_id} cancelled" in screen.text
    batch = server.client(key).batches.retrieve(batch_id)
    assert batch.status == "cancelled"
    errors = (tmp_path / "out" / f"{batch_id}_errors.jsonl").read_text().splitlines()
    assert len(errors) == 20 and {json.loads(line)["error"]["code"] for line in errors} == {"batch_cancelled"}


def test_ctrl_c_answered_no_leaves_the_batch_running(
    server: LiveServer, key: str, env: dict[str, str], tmp_path: Path
) -> None:
    source = job(tmp_path / "long.jsonl", [chat_line(i, max_tokens=10**8) for i in range(4)])
    screen = Terminal(["submit", str(source), "--wait"], env=env, cwd=tmp_path)
    batch_id = screen.expect(r"created (batch_\w+)").group(1)
    screen.expect(r"in_progress:")
    screen.type("\x03")
    screen.expect(r"Cancel batch .*\[y/N\]")
    screen.type("n\n")
    assert screen.wait() == 130
    assert f"{batch_id} keeps running" in screen.text and "Traceback" not in screen.text
    assert server.client(key).batches.retrieve(batch_id).status == "in_progress"
    cancelled = run_cli(["batches", "cancel", batch_id], env=env, cwd=tmp_path)
    assert cancelled.returncode == 0 and cancelled.stdout.strip() == f"{batch_id} cancelling"


def test_without_wait_a_script_gets_the_batch_id_and_no_bars(
    server: LiveServer, key: str, env: dict[str, str], tmp_path: Path
) -> None:
    source = job(tmp_path / "jobs.jsonl", [chat_line(i) for i in range(3)])
    result = run_cli(["submit", str(source)], env=env, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    batch_id = result.stdout.strip()
    assert re.fullmatch(r"batch_\w+", batch_id) and "%|" not in result.stderr  # no bar off a terminal
    waited = run_cli(["submit", str(source), "--wait", "--json", "-o", "out"], env=env, cwd=tmp_path)
    assert waited.returncode == 0, waited.stderr
    body = json.loads(waited.stdout)
    Batch.model_validate(body)
    assert body["status"] == "completed" and body["cost"]["billed_usd"] and len(body["downloaded"]) == 1
    assert Path(tmp_path, body["downloaded"][0]).is_file()


def test_a_batch_that_fails_validation_exits_with_its_own_code(
    server: LiveServer, env: dict[str, str], tmp_path: Path
) -> None:
    source = tmp_path / "bad.jsonl"
    source.write_bytes(to_jsonl([chat_line(0)]) + b"not json\n")
    result = run_cli(["submit", str(source), "--wait"], env=env, cwd=tmp_path)
    assert result.returncode == 3, result.stderr
    assert " failed · " in result.stdout and "files: none" in result.stdout
    assert "1 error: " in result.stdout and "(line 2)" in result.stdout  # why it failed (issue 19 bug 7)


def test_bad_keys_and_urls_are_one_line_errors_without_tracebacks(
    server: LiveServer, env: dict[str, str], tmp_path: Path
) -> None:
    cases = [
        (["batches", "list", "--api-key", "sk-wrong"], 1, "rejected the API key: Incorrect API key provided."),
        (["batches", "list", "--base-url", "http://127.0.0.1:9"], 1, "cannot reach the Backfill server at"),
        (["batches", "show", "batch_nope"], 1, "No batch found with id 'batch_nope'. (HTTP 404)"),
    ]
    for args, code, message in cases:
        result = run_cli(args, env=env, cwd=tmp_path)
        assert result.returncode == code, (args, result.stderr)
        assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1, (args, result.stderr)
    no_key = {name: value for name, value in env.items() if name != "BACKFILL_API_KEY"}
    result = run_cli(["files", "list"], env=no_key, cwd=tmp_path)
    assert result.returncode == 2 and "no API key" in result.stderr and "Traceback" not in result.stderr
    openai_env = {name: value for name, value in no_key.items() if name != "BACKFILL_BASE_URL"}
    openai_env.update({"OPENAI_API_KEY": env["BACKFILL_API_KEY"], "OPENAI_BASE_URL": env["BACKFILL_BASE_URL"]})
    assert run_cli(["files", "list"], env=openai_env, cwd=tmp_path).returncode == 0  # the OPENAI_* fallbacks


def test_usage_errors_exit_2_with_one_line(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    source = job(tmp_path / "jobs.jsonl", [chat_line(0)])
    for args, message in (
        (["submit", str(tmp_path / "missing.jsonl")], "no such file"),
        (["submit", str(source), "--metadata", "novalue"], "--metadata takes KEY=VALUE"),
        (["batches", "list", "--base-url", "ftp://x"], "must start with http"),
    ):
        code, _, err = cli(*args)
        assert code == 2 and message in err and err.count("\n") == 1, (args, err)
    with pytest.raises(SystemExit) as exit_:
        cli("batches", "list", "--limit", "500")
    assert exit_.value.code == 2  # argparse: "argument --limit: must be between 1 and 100, got 500"


def test_a_submit_refused_at_create_leaves_no_uploaded_file_behind(  # type: ignore[no-untyped-def]
    cli, server: LiveServer, key: str, tmp_path: Path
) -> None:
    """Issue 19 bug 7: the upload stayed in the user's files after the batch create was refused."""
    source = job(tmp_path / "jobs.jsonl", [chat_line(0)])
    code, out, err = cli("submit", str(source), "--window", "7d")
    assert code == 1 and out == "" and "completion_window" in err, err
    assert "deleted the uploaded file" in err, err
    assert [f.id for f in server.client(key).files.list(purpose="batch")] == []
