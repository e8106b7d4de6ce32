"""The console in a real headless browser (Debian's chromium, driven by playwright) on the real vLLM engine: a tenant.

Sign in, upload a file with bad lines and see them by number, create a batch with a spend cap, watch its
progress bar move, open its errors, download its output; pause, re-prioritise, resume and cancel another
batch, retry its failed lines (the page says what a retry fixed and offers a retry only while one may run);
poll a paused batch's results for almost nothing (304s); read webhook attempts; see the month against the
budget; a second tenant sees none of it. The admin's pages: test_console_admin.py. With BACKFILL_SCREENSHOTS=1
each page is written to docs/console/ (desktop and 360 px wide).

Every wait is for a state the page shows (generous timeouts, no fixed sleeps): the test runs inside a loaded
full suite, and the only process-wide state it shares (engine busy counters) is read by model name.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import httpx
import pytest

from tests.conftest import LiveServer, make_key
from tests.e2e.console.browser import CHROMIUM, WAIT_MS, chat, playwright, shot, sign_in
from tests.factories import make_batch, make_request, make_tenant
from tests.integration.api.helpers import to_jsonl, upload
from tests.integration.receiver import Receiver

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Debian's chromium: infra/local/services.sh installs it"),
]


# Set window.mediaDrawn once the media card is drawn again: the observer's callback runs after the script that drew
# it, so by then that script (a batch page's first load) has ended.
MEDIA_DRAWN = """() => { window.mediaDrawn = false;
  new MutationObserver(() => { window.mediaDrawn = true; })
    .observe(document.getElementById("batch-media"), { childList: true }); }"""


def test_a_tenant_uploads_watches_reads_errors_downloads_controls_and_cancels(
    live: LiveServer, page: playwright.Page, receiver: Receiver, tmp_path: Path
) -> None:
    expect = playwright.expect
    expect.set_options(timeout=WAIT_MS)
    key, other_key, admin_key = make_key("acme"), make_key("globex"), make_key("ops", admin=True)
    sign_in(page, live.base_url, key)
    shot(page, "signin-empty")
    hook = httpx.post(
        f"{live.base_url}/v1/webhooks", json={"url": receiver.url}, headers={"Authorization": f"Bearer {key}"}
    ).json()

    # A file with bad lines: each is shown by its number, and the batch cannot be created.
    broken = tmp_path / "broken.jsonl"
    broken.write_bytes(
        to_jsonl([chat(1), "not json", chat(3), {"custom_id": "c4", "method": "POST"}]).replace(
            b'"not json"', b"{not json"
        )
    )
    page.click("nav a[data-view=upload]")
    page.set_input_files("#upload-file", str(broken))
    page.click("#upload-check")
    expect(page.locator("#upload-problems li")).to_have_count(2)
    assert page.locator("#upload-problems li").evaluate_all("items => items.map(li => li.dataset.line)") == ["2", "4"]
    expect(page.locator("#upload-create")).to_be_disabled()
    shot(page, "upload")

    # A good file (one line the engine refuses) with a spend cap becomes a batch; its bar moves on the real engine.
    # Line 1 is long (900 tokens): the batch cannot end before it, so the page sees the short lines done
    # while it runs however fast or slow the machine is (no race with the poll).
    lines = [chat(0, max_tokens=900)] + [chat(i) for i in range(1, 40)] + [chat(98, temperature=-3)]
    good = tmp_path / "good.jsonl"
    good.write_bytes(to_jsonl(lines))
    page.set_input_files("#upload-file", str(good))
    page.fill("#upload-metadata", '{"project": "console-e2e"}')
    page.fill("#upload-cap", "0.01")
    page.click("#upload-check")
    expect(page.locator("#upload-create")).to_be_enabled()
    # every offered window with its deadline, predicted finish and price (issue 40 §3); the one asked for is chosen
    menu = page.locator("#upload-menu tbody tr")
    expect(menu).to_have_count(2)
    assert menu.evaluate_all("rows => rows.map(r => r.dataset.window)") == ["24h", "background"]
    expect(page.locator("#upload-menu tr.chosen")).to_have_attribute("data-window", "24h")
    expect(page.locator("#upload-menu tr[data-window=background] td").nth(1)).to_have_text("none")
    page.click("#upload-create")
    page.wait_for_url("**/console#/batch/batch_*")
    expect(page.locator("#batch-progress svg.bar")).to_have_count(1)
    page.evaluate(WATCH_PROGRESS)  # records the bar's done count at every redraw, however slow the machine is
    expect(page.locator("#batch-status")).to_have_text("completed", timeout=300_000)
    seen = page.evaluate("() => window.seen")
    assert any(done > 0 and status != "completed" for done, status in seen), f"the bar never moved: {seen}"
    bar = page.locator("#batch-progress svg.bar")
    expect(bar).to_have_attribute("data-done", "40")
    expect(bar).to_have_attribute("data-failed", "1")
    # its cap, with what it was billed so far (1,836 output tokens at $2 per million: about a third of it)
    cap = page.locator("#batch-cap svg.meter")
    expect(cap).to_have_attribute("data-cap", "0.01")
    assert 0 < float(cap.get_attribute("data-spent") or 0) < 0.01
    expect(page.locator("#batch-cap")).to_contain_text("billed so far of $0.0100")

    # Its errors, grouped by code with the line number; then its output, downloaded.
    group = page.locator("#error-groups details")
    expect(group).to_have_count(1)
    expect(group.locator("tr.error-line td").first).to_have_text("41")
    expect(page.locator("#results-preview")).to_contain_text("chat.completion")
    shot(page, "batch")
    with page.expect_download() as download:
        page.click("button[data-download=output]")
    output = Path(download.value.path()).read_text().splitlines()
    assert len(output) == 40 and all(json.loads(line)["response"]["status_code"] == 200 for line in output)

    # Another batch, controlled from the console: each button asks first, then the page shows the outcome.
    client = live.client(key)
    other = client.batches.create(
        input_file_id=upload(client, to_jsonl([chat(i, max_tokens=900) for i in range(16)])).id,
        endpoint="/v1/chat/completions",
        completion_window="background",
    )
    # The page's first load waits on the lines it shows the media of: held until a control has been pressed.
    held: list[playwright.Route] = []
    lines_sent = f"**/v1/files/{other.input_file_id}/content*"
    page.route(lines_sent, lambda route: held.append(route))
    page.goto(f"{live.base_url}/console#/batch/{other.id}")
    outcome, status = page.locator("#control-outcome"), page.locator("#batch-status")
    expect(page.locator("#batch-left b")).to_have_text("no deadline")  # a background batch never expires
    control(page, "pause", "Pause: done")
    deadline = time.monotonic() + WAIT_MS / 1000
    while not held:
        assert time.monotonic() < deadline, "the page never asked for the lines it sent"
        page.wait_for_timeout(50)
    page.evaluate(MEDIA_DRAWN)
    for route in held:
        route.continue_()
    page.unroute(lines_sent)
    page.wait_for_function("() => window.mediaDrawn")  # the first load has ended (the observer runs after it)
    expect(outcome).to_contain_text("Pause: done")  # pressed during the first load, still shown after it
    expect(status).to_have_text("paused")
    # While it stands still, each poll of its results names the answer it holds and gets a 304, no body.
    with page.expect_response(lambda r: f"/v1/batches/{other.id}/results" in r.url and r.status == 304):
        pass
    assert page.results and all("limit=5" in url for url in page.results), page.results  # type: ignore[attr-defined]
    control(page, "priority", "Priority: done, now 7.")
    expect(page.locator("#batch-priority b")).to_have_text("7")
    shot(page, "batch-paused")
    control(page, "resume", "Resume: done")
    expect(status).to_have_text(re.compile("^(in_progress|validating)$"))  # running again, not paused
    control(page, "cancel", "Cancel: done")
    expect(status).to_have_text("cancelled")

    # Retrying the cancelled batch's failed lines makes a new batch, linked both ways.
    control(page, "retry", "Retry: done")
    retry_id = outcome.locator("a code").text_content()
    assert retry_id and retry_id.startswith("batch_") and retry_id != other.id
    expect(page.locator("#batch-retries")).to_contain_text(retry_id)
    expect(page.locator("#retried-note")).to_contain_text("A retry is running")
    expect(page.locator("#batch-controls button[data-action=retry]")).to_have_count(0)  # it would be refused
    outcome.locator("a").click()
    page.wait_for_url(f"**/console#/batch/{retry_id}")
    expect(page.locator("#batch-retry-of")).to_contain_text(other.id)
    control(page, "cancel", "Cancel: done")  # it would run 16 long lines: stop it
    expect(status).to_have_text("cancelled")
    page.goto(f"{live.base_url}/console#/batch/{other.id}")  # its lines failed again: retrying is offered again
    expect(page.locator("#batch-controls button[data-action=retry]")).to_have_count(1)
    expect(page.locator("#retried-note")).not_to_contain_text("A retry is running")

    page.click("nav a[data-view=batches]")
    expect(page.locator("#batch-table tbody tr")).to_have_count(3)
    page.fill("#filter-q", "console-e2e")
    page.click("#batch-filter button")
    expect(page.locator("#batch-table tbody tr")).to_have_count(1)
    page.fill("#filter-q", "")
    page.click("#batch-filter button")
    expect(page.locator("#batch-table tbody tr")).to_have_count(3)
    discounts = page.locator("#batch-table td.discount").all_text_contents()
    assert all(re.fullmatch(r"\d+(\.\d)?% \((24h|background)\)( · \$[\d.]+ saved)?", d) for d in discounts), discounts
    shot(page, "batches")

    # A batch whose retry completed every failed line: the page says so and offers no retry (nothing is left).
    fixed = retried_batch("acme")
    page.goto(f"{live.base_url}/console#/batch/{fixed}")
    expect(page.locator("#retried-note")).to_contain_text("3 of the 3 failed lines below succeeded in a retry")
    expect(page.locator("#retried-note")).to_contain_text("none is still failing")
    expect(page.locator("#batch-controls button[data-action=retry]")).to_have_count(0)
    shot(page, "batch-retried")
    delivered(live, key, hook["id"])
    for view in ("files", "webhooks"):
        page.click(f"nav a[data-view={view}]")
        expect(page).to_have_title(f"Backfill · {view}")  # set once the view has loaded
        if view == "webhooks":  # each attempt shows the receiver's answer
            page.click(f"#hook-table tr:has-text('{hook['id']}') button:has-text('Deliveries')")
            expect(
                page.locator("#hook-deliveries td.attempts").filter(has_text=re.compile(r"^200$")).first
            ).to_be_visible()
        shot(page, view)

    # The month against the tenant's budget (set by an admin): what it spent so far, and a bar.
    budget = httpx.post(
        f"{live.base_url}/v1/organization/budgets",
        json={"tenant": "acme", "monthly_budget_usd": "0.05"},
        headers={"Authorization": f"Bearer {admin_key}"},
    ).json()
    page.click("nav a[data-view=finance]")
    meter = page.locator("#finance-budget svg.meter")
    expect(meter).to_have_attribute("data-cap", "0.05")
    assert float(meter.get_attribute("data-spent") or 0) == float(budget["spent_usd"]) > 0
    expect(page.locator("#finance-budget")).to_contain_text("of $0.0500 this month")
    expect(page.locator("#spend-chart")).to_be_visible()
    expect(page.locator("#budgets-card")).to_be_hidden()  # every tenant's budget is for admins
    shot(page, "finance")

    # Sign-out forgets the key; a second tenant sees none of it.
    page.click("#sign-out")
    assert page.evaluate("() => sessionStorage.length") == 0
    expect(page.locator("#view-signin")).to_be_visible()
    sign_in(page, live.base_url, other_key)
    page.click("nav a[data-view=batches]")
    expect(page.locator("#batches-empty")).to_be_visible()
    expect(page.locator("#batch-table tbody tr")).to_have_count(0)
    page.goto(f"{live.base_url}/console#/batch/{other.id}")
    expect(page.locator("#batch-title")).to_have_text("Batch not found")
    page.click("nav a[data-view=files]")
    expect(page).to_have_title("Backfill · files")
    expect(page.locator("#file-table tbody tr")).to_have_count(0)
    expect(page.locator("#nav-admin")).to_be_hidden()
    assert page.problems == []  # type: ignore[attr-defined]


WATCH_PROGRESS = """() => {
  window.seen = [];
  const where = document.getElementById("batch-progress"), status = document.getElementById("batch-title");
  const note = () => {
    const bar = where.querySelector("svg.bar"), badge = document.getElementById("batch-status");
    if (bar && badge) window.seen.push([Number(bar.getAttribute("data-done")), badge.textContent]);
  };
  note();
  for (const node of [where, status]) new MutationObserver(note).observe(node, { childList: true, subtree: true });
}"""


def retried_batch(tenant: str) -> str:
    """A cancelled batch of 3 lines whose retry completed all 3 (rows as a retry leaves them)."""
    from storage import lifecycle
    from storage.db import transaction

    with transaction() as session:
        owner = make_tenant(session, tenant)
        origin = make_batch(session, tenant=owner, model="backfill-demo", status=lifecycle.CANCELLED)
        for _ in range(3):
            row = make_request(session, batch=origin, status=lifecycle.REQ_CANCELLED)
            row.error_code, row.error_message = "batch_cancelled", "The batch was cancelled before this request ran."
        origin.request_total, origin.request_failed = 3, 3
        retry = make_batch(session, tenant=owner, model="backfill-demo", status=lifecycle.COMPLETED)
        retry.retry_of, retry.retry_root, retry.attempt = origin.id, origin.id, 1
        retry.request_total, retry.request_completed = 3, 3
        return origin.id


def delivered(live: LiveServer, key: str, endpoint_id: str) -> None:
    """Wait until the endpoint has a delivery with an answered attempt (the batch events went out)."""
    deadline = time.monotonic() + WAIT_MS / 1000
    url, headers = f"{live.base_url}/v1/webhooks/{endpoint_id}/deliveries", {"Authorization": f"Bearer {key}"}
    while not any(a.get("status_code") for d in httpx.get(url, headers=headers).json()["data"] for a in d["attempts"]):
        assert time.monotonic() < deadline, "no webhook delivery was attempted"
        time.sleep(0.2)


def control(page: playwright.Page, action: str, outcome: str) -> None:
    """Press a batch control (the dialog handler confirms it) and wait for the page to show the outcome."""
    page.click(f"#batch-controls button[data-action={action}]")
    playwright.expect(page.locator("#control-outcome")).to_contain_text(outcome)
