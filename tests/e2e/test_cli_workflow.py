"""The workflow of issue 40 through the `backfill` command, run as a user runs it (a subprocess, or a pseudo-terminal
for the watched runs), against a live server on the real vLLM engine (tiny demo model), embedded: one test per
section. Small batches of a few tokens a line, so each stays within a minute or two on CPU.

1. a trial: `submit --trial … --wait` stops at its report (exit 75), `batches resume --wait` runs the rest; a second
   batch stopped at its report is cancelled;
2. checks: `submit --checks … --max-attempts 3 --wait` tallies the draws, `batches attempts` pages each line's;
3. windows: `submit --estimate` prints the menu and creates nothing, `submit --window 4h --wait` runs on it;
4. on expiry: `submit --on-expiry continue_in_background --wait` ends `expired` naming its background child, whose
   results and the merged view give each line once, whole.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from openai.types.chat import ChatCompletion

from tests.conftest import LiveServer, make_key, start_server
from tests.e2e.resume import CHECKPOINT_ENV, wait_until_checkpointed_mid_decode
from tests.integration.api.helpers import to_jsonl
from tests.integration.client.terminal import Terminal, cli_env, run_cli

pytestmark = pytest.mark.vllm
MODEL = "backfill-demo"
WINDOWS = {"1h": "0.2", "4h": "0.4", "24h": "0.5", "background": "0.6"}
EXPIRY_MAX_TOKENS = 960  # about 10 s a wave of 4 on the demo model: still mid-decode when the window closes


@pytest.fixture
def live(demo_model_path: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[LiveServer]:
    from tests.conftest import configure
    from worker.cli.migrate import migrate_database

    models = {MODEL: {"path": str(demo_model_path), "max_num_seqs": 4, "max_model_len": 1024, "dtype": "float32"}}
    env = {
        "BACKFILL_DATA_DIR": str(tmp_path / "data"),
        "BACKFILL_MODELS": json.dumps(models),
        "BACKFILL_COMPLETION_WINDOWS": json.dumps(WINDOWS),
        "BACKFILL_REAP_INTERVAL_SECONDS": "1",  # an expired batch ends (and its child starts) within a second
        **CHECKPOINT_ENV,
    }
    configure(monkeypatch, env)
    migrate_database()
    server, stop = start_server(with_worker=True)
    yield server
    stop()


@pytest.fixture
def user(live: LiveServer, tmp_path: Path) -> dict[str, str]:
    """A user's shell pointed at the server with acme's key."""
    return cli_env(live.base_url, make_key("acme"), tmp_path / "client")


def jobs(path: Path, count: int, **body: Any) -> Path:
    rows = [
        {
            "custom_id": f"line-{i}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {"model": MODEL, "messages": [{"role": "user", "content": f"Say {i}."}], **body},
        }
        for i in range(count)
    ]
    path.write_bytes(to_jsonl(rows))
    return path


def backfill(user: dict[str, str], cwd: Path, *args: str, timeout: float = 600) -> tuple[int, str, str]:
    done = run_cli(list(args), env=user, cwd=cwd, timeout=timeout)
    return done.returncode, done.stdout, done.stderr


def indented(out: str) -> dict[str, str]:
    """The trial report's `  name  value` rows."""
    pairs = (line.strip().split("  ", 1) for line in out.splitlines() if line.startswith("  "))
    return {name: value.strip() for name, value in pairs}


def shown(out: str) -> dict[str, str]:
    """`batches show`'s `key  value` rows."""
    pairs = (line.split("  ", 1) for line in out.splitlines() if "  " in line and not line.startswith(" "))
    return {name.strip(): value.strip() for name, value in pairs}


def results(live: LiveServer, user: dict[str, str], batch_id: str) -> dict[str, dict[str, Any]]:
    text = live.client(user["BACKFILL_API_KEY"]).get(f"/batches/{batch_id}/results", cast_to=str)
    return {line["custom_id"]: line for line in map(json.loads, text.splitlines())}


def test_a_trial_stops_submit_wait_at_its_report_then_resume_wait_runs_the_rest(
    live: LiveServer, user: dict[str, str], tmp_path: Path
) -> None:
    source = jobs(tmp_path / "jobs.jsonl", 12, max_tokens=4, temperature=1.0)
    code, out, err = backfill(user, tmp_path, "submit", str(source), "--trial", '{"lines": 3}', "--wait", "-o", "out")
    assert code == 75, err  # paused after its trial: not finished, a person decides
    batch_id = out.split()[0]
    batch = live.client(user["BACKFILL_API_KEY"]).batches.retrieve(batch_id)
    report = (batch.model_extra or {})["trial"]["report"]
    cost = report["projected_cost"]
    said = indented(out)
    assert said["lines run"] == "3 of 12" and said["decision"] == "paused: resume to run the rest, or cancel"
    assert said["projected"].startswith(f"${cost['estimate_usd']} for the whole batch (95%: ${cost['low_usd']} to")
    assert (
        said["tokens"]
        == f"{report['tokens_per_line']['input']:g} in / {report['tokens_per_line']['output']:g} out per line"
    )
    assert f"backfill batches resume {batch_id} --wait" in out
    print(f"trial report through the CLI:\n{out}")

    code, out, _ = backfill(user, tmp_path, "batches", "show", batch_id)
    assert code == 0 and shown(out)["trial"] == "3 lines first, then pauses (manual) · reported"

    code, out, err = backfill(user, tmp_path, "batches", "resume", batch_id, "--wait", "-o", "out")
    assert code == 0, err
    assert f"{batch_id} completed · 12 completed, 0 failed of 12" in out
    output = (tmp_path / "out" / f"{batch_id}_output.jsonl").read_text().splitlines()
    assert sorted(json.loads(line)["custom_id"] for line in output) == sorted(f"line-{i}" for i in range(12))  # once
    for line in output:
        ChatCompletion.model_validate(json.loads(line)["response"]["body"])

    # A second batch stopped at its report is cancelled instead; its results say so.
    code, out, _ = backfill(user, tmp_path, "submit", str(source), "--trial", '{"lines": 2}')
    other = out.strip()
    code, out, _ = backfill(user, tmp_path, "batches", "results", other, "--wait", "-o", "out")
    assert code == 75 and f"{other} paused after its trial:" in out
    code, out, _ = backfill(user, tmp_path, "batches", "cancel", other)
    assert code == 0
    code, out, _ = backfill(user, tmp_path, "batches", "results", other, "--wait", "-o", "out")
    assert code == 5 and f"{other} cancelled · 2 completed, 10 failed of 12" in out


def test_checks_with_max_attempts_tally_the_draws_and_attempts_pages_each_line(
    live: LiveServer, user: dict[str, str], tmp_path: Path
) -> None:
    rows = jobs(tmp_path / "jobs.jsonl", 12, temperature=1.0)
    lines = [json.loads(line) for line in rows.read_text().splitlines()]
    for i, line in enumerate(lines):
        line["body"]["max_tokens"] = 1 + i % 4  # one token's text fits 16 characters; four tokens' often do not
        line["body"]["seed"] = i
    for line in lines[-2:]:  # 64 tokens never fit 16 characters: these two fail every draw, whatever is sampled
        line["body"].update(max_tokens=64, ignore_eos=True)
    rows.write_bytes(to_jsonl(lines))
    code, out, err = backfill(
        user,
        tmp_path,
        "submit",
        str(rows),
        "--checks",
        '{"max_length": 16}',
        "--max-attempts",
        "3",
        "--wait",
        "-o",
        "out",
    )
    assert code == 0, err
    batch_id = out.split()[0]
    found = results(live, user, batch_id)
    first = sum(1 for line in found.values() if line["error"] is None and line["attempts"]["count"] == 1)
    again = sum(1 for line in found.values() if line["error"] is None and line["attempts"]["count"] > 1)
    failed = sum(1 for line in found.values() if line["error"] is not None)
    summary = out.strip().splitlines()[-1]
    assert f"checks: {first} passed at the first draw, {again} drawn again, {failed} failed every draw" in summary
    assert failed >= 2  # the two 64-token lines, at least
    print(f"summary: {summary}")

    code, page, err = backfill(user, tmp_path, "batches", "attempts", batch_id, "--limit", "8")
    assert code == 0 and f"more: backfill batches attempts {batch_id} --after rs_8" in err
    code, rest, _ = backfill(user, tmp_path, "batches", "attempts", batch_id, "--after", "rs_8")
    table = [row.split() for text in (page, rest) for row in text.splitlines()[2:]]
    assert sorted(row[0] for row in table) == sorted(found)  # every line once, over two pages
    for row in table:
        line = found[row[0]]
        assert row[1] == ("answered" if line["error"] is None else "checks_failed")
        kept = 1 if line["error"] is None else 0  # a line no draw satisfied failed every one of its draws
        assert int(row[2]) == line["attempts"]["count"] == len(line["attempts"]["failed"]) + kept
        assert row[3] == ("none" if line["attempts"]["count"] == 1 else "1:")  # each failed draw, from the first
    print(f"attempts, page 1:\n{page}{err}")


def test_estimate_prints_every_window_then_submit_runs_on_the_one_chosen(
    live: LiveServer, user: dict[str, str], tmp_path: Path
) -> None:
    client = live.client(user["BACKFILL_API_KEY"])
    source = jobs(tmp_path / "jobs.jsonl", 6, max_tokens=4)
    code, out, err = backfill(user, tmp_path, "submit", str(source), "--estimate")
    assert code == 0, err
    menu = {line.split()[0]: line.split() for line in out.splitlines() if line.split()[:1] in ([w] for w in WINDOWS)}
    assert list(menu) == list(WINDOWS)  # shortest first, background last
    for window, row in menu.items():  # each window's discount off the list price, and admission's verdict
        verdict = " ".join(row[row.index(f"{round(float(WINDOWS[window]) * 100)}%") + 2 :])
        assert verdict.startswith(("yes", "no: ")), row
    assert "none (background)" in " ".join(menu["background"])
    assert client.batches.list().data == [] and client.files.list().data == []  # nothing created, nothing left
    print(f"the menu through the CLI:\n{out}{err}")
    code, out, _ = backfill(user, tmp_path, "submit", str(source), "--estimate", "--json")
    priced = {w["completion_window"]: w["price"]["billed_usd"] for w in json.loads(out)["windows"]}

    code, out, err = backfill(user, tmp_path, "submit", str(source), "--window", "4h", "--wait", "-o", "out")
    assert code == 0, err
    batch = client.batches.retrieve(out.split()[0])
    assert batch.completion_window == "4h" and "40% off" in out
    billed = (batch.model_extra or {})["cost"]["billed_usd"]
    assert 0 < float(billed) <= float(priced["4h"])  # the menu priced every line at its full budget

    code, _, err = backfill(user, tmp_path, "submit", str(source), "--window", "2h")
    assert code == 1 and "this server offers 1h, 24h, 4h, background" in err  # the server names what it offers
    inputs = [file for file in client.files.list().data if file.purpose == "batch"]
    assert [file.id for file in inputs] == [batch.input_file_id]  # its upload was deleted; the 4h batch's input stays


def test_on_expiry_continue_in_background_names_the_child_and_the_merged_view_has_each_line_once(
    live: LiveServer, user: dict[str, str], tmp_path: Path
) -> None:
    from tests.integration.worker.feed.test_expiry_cuts import window_closes
    from worker.process.service import reap_once

    source = jobs(tmp_path / "long.jsonl", 4, max_tokens=EXPIRY_MAX_TOKENS, temperature=0, ignore_eos=True)
    screen = Terminal(
        ["submit", str(source), "--on-expiry", "continue_in_background", "--wait", "-o", "out"], env=user, cwd=tmp_path
    )
    batch_id = screen.expect(r"created (batch_\w+)", timeout=120).group(1)
    wait_until_checkpointed_mid_decode(batch_id, alive=lambda: True)
    window_closes(batch_id)  # as a clock moved past the 24 hours would have it
    reap_once()  # the reaper's pass now, while the lines are mid-generation

    assert screen.wait(timeout=300) == 4, screen.text  # the batch expired (its lines go on elsewhere)
    origin = live.client(user["BACKFILL_API_KEY"]).batches.retrieve(batch_id)
    (child,) = (origin.model_extra or {})["retries"]
    summary = " ".join(screen.text.split())
    assert f"{batch_id} expired" in summary
    assert f"its unfinished lines continue in the background in {child}" in summary
    assert (
        f"backfill batches results {child} --wait" in summary
        and f"backfill batches results {batch_id} --merged" in summary
    )
    code, out, _ = backfill(user, tmp_path, "batches", "show", batch_id)
    assert shown(out)["on expiry"].startswith("unfinished lines continue in the background")

    code, out, err = backfill(user, tmp_path, "batches", "results", child, "--wait", "-o", "out")
    assert code == 0 and f"{child} completed" in out, err
    code, _, err = backfill(user, tmp_path, "batches", "results", batch_id, "--merged", "-o", "merged.jsonl")
    assert code == 4, err  # the origin's own end state
    merged = [json.loads(line) for line in (tmp_path / "merged.jsonl").read_text().splitlines()]
    assert sorted(line["custom_id"] for line in merged) == [f"line-{i}" for i in range(4)]  # each once
    for line in merged:  # whole answers: the continued lines resumed from their checkpoints to the end
        completion = ChatCompletion.model_validate(line["response"]["body"])
        assert completion.usage is not None and completion.usage.completion_tokens == EXPIRY_MAX_TOKENS
    print(f"on expiry through the CLI: {summary[-600:]}")
