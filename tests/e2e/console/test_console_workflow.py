"""The console's batch page shows a batch's workflow (issue 40, docs/workflow.md) as text: its trial's report (lines
run, success rate by error code, checks passed, tokens per line, the projected cost with its interval, the trial's
status and whether it goes on by itself) with the Resume and Cancel controls of a paused batch; its checks and what
expiry does; each result line's attempts with the check every failed draw failed, a page of lines at a time (a line
past the first page too); and an answer cut at expiry.

On the fake engine (its answer's words follow the draw's seed, so a redraw draws other words): what is judged here is
the page; the trial, the checks and the cuts themselves are proved in tests/integration/api/openai/test_workflow.py,
tests/integration/worker/feed/test_expiry_cuts.py and on the real engine in tests/e2e/test_workflow.py.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from openai.types import Batch

from tests.conftest import LiveServer, make_key, start_server
from tests.e2e.console.browser import CHROMIUM, FLAGS, WAIT_MS, shot, sign_in
from tests.integration.api.helpers import to_jsonl, upload, wait_for

pytestmark = pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Debian's chromium: infra/local/services.sh")
playwright = pytest.importorskip("playwright.sync_api")
MODEL = "fake-chat"
PRICES = {
    "prices": [
        {"model": MODEL, "effective_from": "2025-01-01", "input_usd_per_mtok": "1", "output_usd_per_mtok": "4"},
    ]
}


@pytest.fixture
def live(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[LiveServer]:
    from tests.conftest import configure
    from worker.cli.migrate import migrate_database

    model = {"path": "fake:", "max_num_seqs": 8, "max_model_len": 10**9, "extra": {"step_seconds": 0.001}}
    configure(
        monkeypatch,
        {
            "BACKFILL_DATA_DIR": str(tmp_path / "data"),
            "BACKFILL_MODELS": json.dumps({MODEL: model}),
            "BACKFILL_PRICE_BOOK": json.dumps(PRICES),
            "BACKFILL_REAP_INTERVAL_SECONDS": "1",
            "BACKFILL_CHECKPOINT_INTERVAL_SECONDS": "0.2",
        },
    )
    migrate_database()
    server, stop = start_server(with_worker=True)
    yield server
    stop()


@pytest.fixture
def page(live: LiveServer) -> Iterator[playwright.Page]:
    with playwright.sync_playwright() as driver:
        browser = driver.chromium.launch(executable_path=str(CHROMIUM), args=FLAGS)
        context = browser.new_context(viewport={"width": 1280, "height": 900})
        tab = context.new_page()
        tab.set_default_timeout(WAIT_MS)
        tab.on("dialog", lambda dialog: dialog.accept())  # the controls ask for confirmation
        problems: list[str] = []  # script errors and policy (CSP) refusals: the page must cause none
        tab.on("pageerror", lambda error: problems.append(f"page error: {error}"))
        tab.on("console", lambda msg: problems.append(msg.text) if "Content Security Policy" in msg.text else None)
        tab.problems = problems  # type: ignore[attr-defined]
        yield tab
        context.close()
        browser.close()


def chat(i: int, max_tokens: int = 1) -> dict[str, object]:
    body = {"model": MODEL, "messages": [{"role": "user", "content": f"yes or no {i}?"}], "max_tokens": max_tokens}
    return {"custom_id": f"q{i}", "method": "POST", "url": "/v1/chat/completions", "body": body}


def create(client: openai.OpenAI, lines: list[dict[str, object]], **extra: object) -> Batch:
    source = upload(client, to_jsonl(lines))
    return client.batches.create(
        input_file_id=source.id, endpoint="/v1/chat/completions", completion_window="24h", extra_body=extra
    )


def trial_reported(client: openai.OpenAI, batch_id: str) -> dict[str, Any]:
    """The batch's trial report once written (waited for, never slept for)."""
    deadline = time.time() + WAIT_MS / 1000
    while time.time() < deadline:
        trial = (client.batches.retrieve(batch_id).model_extra or {})["trial"]
        if trial["status"] == "reported":
            report: dict[str, Any] = trial["report"]
            return report
        time.sleep(0.1)
    raise AssertionError(f"the trial of {batch_id} never reported")


def result_lines(client: openai.OpenAI, batch_id: str) -> dict[str, dict[str, Any]]:
    text = client.get(f"/batches/{batch_id}/results", cast_to=str)
    return {line["custom_id"]: line for line in map(json.loads, text.splitlines())}


def usd(text: str) -> str:
    """A 6-place dollar string as the page prints a sub-cent amount."""
    value = float(text)
    return "$" + (f"{value:.4f}" if value >= 0.001 or value == 0 else f"{value:.6f}")


def test_a_paused_trial_shows_its_report_controls_checks_and_each_lines_attempts(
    live: LiveServer, page: playwright.Page
) -> None:
    expect = playwright.expect
    expect.set_options(timeout=WAIT_MS)
    key = make_key("acme")
    client = live.client(key)
    checks = {"regex": "lorem|ipsum", "max_attempts": 3}
    batch = create(client, [chat(i) for i in range(20)], trial={"lines": 8, "continue": "manual"}, checks=checks)
    report = trial_reported(client, batch.id)
    lines = result_lines(client, batch.id)
    assert report["decision"] == "paused" and len(lines) == 8

    sign_in(page, live.base_url, key)
    page.goto(f"{live.base_url}/console#/batch/{batch.id}")
    expect(page.locator("#batch-status")).to_have_text("paused")
    expect(page.locator("#trial-status")).to_contain_text("trial reported")
    expect(page.locator("#trial-status")).to_contain_text("pauses after the trial")
    expect(page.locator("#trial-lines b")).to_have_text("8 of 20")
    rate = f"{round(report['success_rate'] * 100, 1):g}%"
    expect(page.locator("#trial-rate b")).to_have_text(f"{rate} ({report['succeeded']} succeeded)")
    c = report["checks"]
    expect(page.locator("#trial-checks b")).to_have_text(
        f"{c['passed']} of 8 · {c['passed_first_time']} at the first draw · {c['redrawn']} redrawn · {c['failed']} failed"
    )
    tokens = report["tokens_per_line"]
    expect(page.locator("#trial-tokens b")).to_have_text(f"in {tokens['input']:g} · out {tokens['output']:g}")
    cost = report["projected_cost"]
    expect(page.locator("#trial-cost b")).to_have_text(
        f"{usd(cost['estimate_usd'])} (95%: {usd(cost['low_usd'])} \u2013 {usd(cost['high_usd'])})"
    )
    expect(page.locator("#trial-decision b")).to_contain_text("paused: resume to run the rest, or cancel")
    if report["errors"]:  # lines no draw satisfied, by their code
        expect(page.locator("#trial-errors tr[data-code=checks_failed]")).to_contain_text(str(c["failed"]))
    else:
        expect(page.locator("#trial-errors")).to_have_text("No trial line failed.")
    expect(page.locator("#batch-controls button[data-action=resume]")).to_be_visible()
    expect(page.locator("#batch-controls button[data-action=cancel]")).to_be_visible()
    settings = page.locator("#batch-workflow-table")
    expect(settings.locator("tr[data-setting=trial] td")).to_have_text(
        "8 lines first · pauses after the trial: resume or cancel it here"
    )
    expect(settings.locator("tr[data-setting=checks] td")).to_have_text(
        "the line's own schema · regex lorem|ipsum · 3 draws at most"
    )
    expect(settings.locator("tr[data-setting=at-expiry] td")).to_contain_text("cut at expiry")

    # Each result line: its attempts and the check each failed draw failed, as the results endpoint has them.
    expect(page.locator("#lines-range")).to_have_text("Lines 1\u20138 of those finished; more come as the batch runs.")
    expect_attempts(page, lines, 8)
    expect(page.locator("#lines-next")).to_be_disabled()
    shot(page, "batch-trial")

    page.click("#batch-controls button[data-action=resume]")
    expect(page.locator("#control-outcome")).to_contain_text("Resume: done")
    expect(page.locator("#batch-status")).to_have_text("completed")
    expect(page.locator("#trial-decision b")).to_contain_text("paused")  # the report stays as it was written

    # Past the first page: lines 11-20 (those that ran after the resume), each with its attempts.
    lines = result_lines(client, batch.id)
    assert len(lines) == 20
    expect(page.locator("#lines-range")).to_have_text("Lines 1\u201310 of those finished.")
    expect_attempts(page, lines, 10)
    first_page = shown_ids(page)
    page.click("#lines-next")
    expect(page.locator("#lines-range")).to_have_text("Lines 11\u201320 of those finished.")
    expect_attempts(page, lines, 10)
    second_page = shown_ids(page)
    assert first_page.isdisjoint(second_page) and first_page | second_page == set(lines)
    expect(page.locator("#lines-next")).to_be_disabled()
    shot(page, "batch-attempts-page-2")
    page.click("#lines-first")
    expect(page.locator("#lines-range")).to_have_text("Lines 1\u201310 of those finished.")
    assert page.problems == []  # type: ignore[attr-defined]


def shown_ids(page: playwright.Page) -> set[str]:
    return set(page.locator("#results-attempts tbody tr").evaluate_all("rows => rows.map(r => r.dataset.customId)"))


def expect_attempts(page: playwright.Page, lines: dict[str, dict[str, Any]], count: int) -> None:
    """The page's attempts rows: `count` of them, each with the results endpoint's outcome, count and failed draws."""
    expect = playwright.expect
    rows = page.locator("#results-attempts tbody tr")
    expect(rows).to_have_count(count)
    for i in range(count):
        row = rows.nth(i)
        line = lines[row.get_attribute("data-custom-id") or ""]
        attempts = line["attempts"]
        expect(row.locator("td").nth(2)).to_have_text(str(attempts["count"]))
        expect(row.locator("td").nth(1)).to_have_text("answered" if line["error"] is None else "checks_failed")
        failed = row.locator(".failed-checks li")
        expect(failed).to_have_count(len(attempts["failed"]))
        for n, draw in enumerate(attempts["failed"]):
            expect(failed.nth(n)).to_have_text(f"attempt {draw['attempt']}: regex · {draw['message']}")


def running_with_tokens(batch_id: str) -> None:
    """Wait until a line of the batch holds a checkpoint: it has generated tokens a cut can keep."""
    from sqlalchemy import func, select

    from storage.db import transaction
    from storage.models import BatchRequest

    deadline = time.time() + WAIT_MS / 1000
    while time.time() < deadline:
        with transaction() as session:
            held = session.scalar(
                select(func.count())
                .select_from(BatchRequest)
                .where(BatchRequest.batch_id == batch_id, BatchRequest.checkpoint_tokens > 0)
            )
        if held:
            return
        time.sleep(0.1)
    raise AssertionError(f"no line of {batch_id} generated a token")


def test_an_answer_cut_at_expiry_is_marked_on_the_batch_page(live: LiveServer, page: playwright.Page) -> None:
    from tests.integration.worker.feed.test_expiry_cuts import window_closes

    expect = playwright.expect
    expect.set_options(timeout=WAIT_MS)
    key = make_key("acme")
    client = live.client(key)
    batch = create(client, [chat(i, max_tokens=10**8) for i in range(2)])  # never finish on their own
    running_with_tokens(batch.id)

    window_closes(batch.id)  # as a clock moved past the window would have it
    ended = wait_for(client, batch.id, timeout=WAIT_MS / 1000)
    assert ended.status == "expired" and ended.request_counts is not None and ended.request_counts.completed >= 1

    sign_in(page, live.base_url, key)
    page.goto(f"{live.base_url}/console#/batch/{batch.id}")
    expect(page.locator("#batch-status")).to_have_text("expired")
    cut = page.locator("#results-attempts tbody tr .badge.cut")
    expect(cut.first).to_have_text(" cut at expiry")
    expect(page.locator("#results-attempts tbody tr").first.locator("td").nth(1)).to_contain_text("answered")
    shot(page, "batch-expiry-cut")
    assert page.problems == []  # type: ignore[attr-defined]


def test_a_message_batch_shows_its_trial_and_each_lines_attempts(live: LiveServer, page: playwright.Page) -> None:
    import anthropic

    expect = playwright.expect
    expect.set_options(timeout=WAIT_MS)
    key = make_key("acme")
    messages = anthropic.Anthropic(api_key=key, base_url=live.base_url, max_retries=0)
    params = {"model": MODEL, "max_tokens": 1, "messages": [{"role": "user", "content": "yes or no?"}]}
    created = messages.messages.batches.create(
        requests=[{"custom_id": f"m{i}", "params": params} for i in range(6)],  # type: ignore[misc]
        extra_body={
            "trial": {"lines": 2, "continue": "auto", "min_success_rate": 0},
            "checks": {"regex": "lorem|ipsum", "max_attempts": 2},
        },
    )
    deadline = time.time() + WAIT_MS / 1000
    while messages.messages.batches.retrieve(created.id).processing_status != "ended" and time.time() < deadline:
        time.sleep(0.1)
    lines = {line.custom_id: line.model_extra or {} for line in messages.messages.batches.results(created.id)}

    sign_in(page, live.base_url, key)
    page.goto(f"{live.base_url}/console#/batch/{created.id}")
    expect(page.locator("#batch-status")).to_have_text("completed")
    expect(page.locator("#trial-decision b")).to_have_text("continued automatically")
    expect(page.locator("#trial-lines b")).to_have_text("2 of 6")
    expect(page.locator("#batch-workflow-table tr[data-setting=trial] td")).to_have_text(
        "2 lines first · continues automatically when at least 0% succeed, else pauses"
    )
    rows = page.locator("#results-attempts tbody tr")
    expect(rows).to_have_count(6)  # one page holds the 6 lines
    for i in range(6):
        row = rows.nth(i)
        attempts = lines[row.get_attribute("data-custom-id") or ""]["attempts"]
        expect(row.locator("td").nth(2)).to_have_text(str(attempts["count"]))
        expect(row.locator(".failed-checks li")).to_have_count(len(attempts["failed"]))
    assert page.problems == []  # type: ignore[attr-defined]
