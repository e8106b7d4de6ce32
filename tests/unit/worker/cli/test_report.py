"""`backfill report` and `backfill estimate`: read the database directly, print a table, CSV or JSON."""

from __future__ import annotations

import argparse
import csv
import io
import json
from pathlib import Path

import pytest

from storage import lifecycle
from storage.db import transaction
from tests.conftest import Backend
from tests.factories import DAY, DAY0, make_batch, make_request, make_run, make_tenant
from worker.cli import estimate as estimate_command
from worker.cli import report as report_command

pytestmark = pytest.mark.backfill_env({"BACKFILL_MODELS": '{"fake-model": {"path": "fake:"}}'})
MARCH_2 = "2026-03-02"


def run_cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    parser = argparse.ArgumentParser(prog="backfill")
    subparsers = parser.add_subparsers(dest="command", required=True)
    report_command.register(subparsers)
    estimate_command.register(subparsers)
    args = parser.parse_args(argv)
    code: int = args.func(args)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def seeded(backend: Backend) -> None:
    """acme: 3 completed requests and 1 failed on March 2; globex: 2 completed on March 2 and 1 on March 3."""
    with transaction() as session:
        acme, globex = make_tenant(session, "acme"), make_tenant(session, "globex")
        run = make_run(session, busy_seconds=50.0, prompt_tokens=5000, completion_tokens=5000)
        for tenant, count in ((acme, 3), (globex, 2)):
            batch = make_batch(session, tenant=tenant)
            for _ in range(count):
                make_request(session, batch=batch, run=run, prompt_tokens=100, completion_tokens=1000)
        make_request(session, batch=make_batch(session, tenant=acme), status=lifecycle.REQ_FAILED)
        later = make_batch(session, tenant=globex, created_at=DAY0 + DAY)
        make_request(session, batch=later, run=run, completion_tokens=10, finished_at=DAY0 + DAY + 5)


def test_costs_table_names_tenants_and_adds_a_total(seeded: None, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(["report", "costs", "--from", MARCH_2, "--to", "2026-03-03", "--group-by", "tenant"], capsys)

    lines = out.splitlines()
    assert code == 0
    assert lines[0].split()[:3] == ["day", "tenant", "requests"]
    assert [line.split()[:3] for line in lines[2:]] == [
        [MARCH_2, "acme", "3"],
        [MARCH_2, "globex", "2"],
        ["2026-03-03", "globex", "1"],
        ["total", "6", "500"],
    ]


def test_costs_json_is_the_api_page_and_csv_has_the_same_rows(seeded: None, capsys: pytest.CaptureFixture[str]) -> None:
    _, out, _ = run_cli(["report", "costs", "--from", MARCH_2, "--to", MARCH_2, "--format", "json"], capsys)
    page = json.loads(out)
    _, out, _ = run_cli(["report", "costs", "--from", MARCH_2, "--to", MARCH_2, "--format", "csv"], capsys)
    rows = list(csv.DictReader(io.StringIO(out)))

    assert page["object"] == "page" and len(page["data"]) == 1
    result = page["data"][0]["results"][0]
    assert result["num_model_requests"] == 5
    # Only completed requests are billed; the run's 50 s are carried by the March 2 and March 3 work.
    assert [(r["date"], r["billed_usd"], r["compute_usd"]) for r in rows] == [
        (MARCH_2, result["billed_usd"], result["compute_usd"])
    ]


def test_a_tenant_filter_and_usage_report(seeded: None, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(
        ["report", "usage", "--from", MARCH_2, "--to", MARCH_2, "--tenant", "acme", "--format", "json"], capsys
    )

    result = json.loads(out)["data"][0]["results"][0]
    assert code == 0
    assert (result["num_model_requests"], result["num_failed_requests"], result["output_tokens"]) == (3, 1, 3000)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--from", "2026-02-30"], "--from must be a date"),
        (["--from", MARCH_2, "--to", "2026-03-01"], "--to must not be before --from"),
        (["--from", MARCH_2, "--tenant", "nobody"], "no tenant named 'nobody'"),
        (["--from", MARCH_2, "--group-by", "project"], "Invalid group_by"),
    ],
)
def test_bad_input_is_one_line_on_stderr_and_exit_2(
    backend: Backend, argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run_cli(["report", "costs", *argv], capsys)

    assert (code, out) == (2, "")
    assert err.startswith("backfill report: error:") and message in err and err.count("\n") == 1


def test_estimate_prints_cost_and_schedule(
    backend: Backend, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with transaction() as session:
        make_run(session, busy_seconds=10.0, completion_tokens=10_000)  # 1,000 tokens per second
    job = tmp_path / "job.jsonl"
    body = {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2000}
    line = {"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", "body": body}
    job.write_text(json.dumps(line) + "\n")

    code, out, _ = run_cli(["estimate", str(job), "--format", "json"], capsys)
    table_code, table, _ = run_cli(["estimate", str(job)], capsys)

    estimate = json.loads(out)
    assert code == table_code == 0
    assert (estimate["model"], estimate["requests"], estimate["throughput"]["source"]) == ("fake-model", 1, "measured")
    assert estimate["job_seconds"] == pytest.approx(2.0, abs=0.1) and estimate["fits_window"] is True
    assert "fits the window" in table and "measured over 1 recent runs" in table
    menu = table.splitlines()[table.splitlines().index(next(r for r in table.splitlines() if r.startswith("window"))) :]
    assert [row.split()[0] for row in menu[1:]] == ["24h", "background"]  # every offered window, background last
    assert menu[2].split()[1:3] == ["none", "(background)"] and menu[1].endswith("yes")
    assert [option["completion_window"] for option in estimate["windows"]] == ["24h", "background"]


def test_estimate_refuses_an_unserved_model_and_a_missing_file(
    backend: Backend, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job = tmp_path / "job.jsonl"
    job.write_text('{"custom_id": "a", "url": "/v1/chat/completions", "body": {"model": "nope"}}\n')

    assert run_cli(["estimate", str(job)], capsys)[0] == 2
    code, _, err = run_cli(["estimate", str(tmp_path / "missing.jsonl")], capsys)
    assert code == 2 and "cannot read" in err


ADAPTER_MODELS = {"fake-model": {"path": "fake:", "adapters": {"tone-a": "/adapters/a", "tone-b": "/adapters/b"}}}


@pytest.mark.backfill_env({"BACKFILL_MODELS": json.dumps(ADAPTER_MODELS), "BACKFILL_BATCH_MAX_ADAPTERS": "1"})
def test_estimate_of_lines_naming_adapters_judges_them_as_validation_does(
    backend: Backend, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job = tmp_path / "job.jsonl"
    lines = [
        {"custom_id": str(i), "method": "POST", "url": "/v1/chat/completions",
         "body": {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 10}}
        for i, model in enumerate(["tone-a", "fake-model", "tone-b"])
    ]  # fmt: skip
    job.write_text("".join(json.dumps(line) + "\n" for line in lines))

    code, out, _ = run_cli(["estimate", str(job), "--format", "json"], capsys)

    estimate = json.loads(out)
    assert code == 0 and (estimate["model"], estimate["requests"], estimate["skipped_lines"]) == ("fake-model", 2, 1)
    assert [(p["line"], p["code"]) for p in estimate["problems"]] == [(3, "too_many_adapters")]
