"""The console in a real headless browser (Debian's chromium, driven by playwright) on the real vLLM engine.

Sign in, upload a file with bad lines and see them by number, create a batch with a spend cap, watch its
progress bar move, open its errors, download its output; pause, re-prioritise, resume and cancel another
batch, retry its failed lines (the page says what a retry fixed and offers a retry only while one may run);
poll a paused batch's results for almost nothing (304s); read webhook attempts; see the month against the
budget; a second tenant sees none of it; an admin lists every tenant's batches and sees the operations charts
(a long queue's figure whole) and every tenant's budget. With BACKFILL_SCREENSHOTS=1 each page is written to
docs/console/ (desktop and 360 px wide).

Every wait is for a state the page shows (generous timeouts, no fixed sleeps): the test runs inside a loaded
full suite, and the only process-wide state it shares (engine busy counters) is read by model name.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import LiveServer, make_key, start_server
from tests.factories import make_batch, make_request, make_tenant
from tests.integration.api.helpers import to_jsonl, upload, wait_for
from tests.integration.receiver import WEBHOOK_TEST_ENV, Receiver, running_receiver

CHROMIUM = Path("/usr/bin/chromium")
DOCS = Path(__file__).resolve().parents[3] / "docs" / "console"
SCREENSHOTS = os.environ.get("BACKFILL_SCREENSHOTS") == "1"
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Debian's chromium: infra/local/services.sh installs it"),
]
playwright = pytest.importorskip("playwright.sync_api")
WAIT_MS = 60_000  # a page state under a loaded CI machine: generous, and only ever waited for, never slept
# list $4 per million output tokens ($2 billed in the 24h window), so the cap and budget show real fractions
PRICES = {
    "prices": [
        {
            "model": "backfill-demo",
            "effective_from": "2025-01-01",
            "input_usd_per_mtok": "1",
            "output_usd_per_mtok": "4",
        }
    ]
}


@pytest.fixture
def live(demo_model_path: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[LiveServer]:
    from tests.conftest import configure
    from worker.cli.migrate import migrate_database

    model = {"path": str(demo_model_path), "max_num_seqs": 4, "max_model_len": 1024, "dtype": "float32"}
    configure(
        monkeypatch,
        {
            "BACKFILL_DATA_DIR": str(tmp_path / "data"),
            "BACKFILL_MODELS": json.dumps({"backfill-demo": model}),
            "BACKFILL_REAP_INTERVAL_SECONDS": "1",
            "BACKFILL_PRICE_BOOK": json.dumps(PRICES),
            "BACKFILL_TENANT_MAX_PRIORITY": "10",
            "BACKFILL_METRICS_CACHE_SECONDS": "1",
            **WEBHOOK_TEST_ENV,  # deliveries to a receiver on this machine
        },
    )
    migrate_database()
    server, stop = start_server(with_worker=True)
    warm_up(server)
    yield server
    stop()


def warm_up(server: LiveServer) -> None:
    """One line through the engine first: it loads on first use (a minute or two on a busy CPU), which is
    setup, not what the console is judged on."""
    client = server.client(make_key("warm-up"))
    source = upload(client, to_jsonl([chat(0, max_tokens=2)]))
    batch = client.batches.create(input_file_id=source.id, endpoint="/v1/chat/completions", completion_window="24h")
    wait_for(client, batch.id, timeout=300)


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with running_receiver() as running:
        yield running


@pytest.fixture
def page(live: LiveServer) -> Iterator[playwright.Page]:
    with playwright.sync_playwright() as driver:
        browser = driver.chromium.launch(executable_path=str(CHROMIUM), args=FLAGS)
        context = browser.new_context(viewport={"width": 1280, "height": 900}, accept_downloads=True)
        tab = context.new_page()
        tab.set_default_timeout(WAIT_MS)
        # the controls ask for confirmation; the priority asks for a number
        tab.on("dialog", lambda dialog: dialog.accept("7" if dialog.type == "prompt" else None))
        problems: list[str] = []  # script errors and policy (CSP) refusals: the page must cause none
        tab.on("pageerror", lambda error: problems.append(f"page error: {error}"))
        tab.on("console", lambda msg: problems.append(msg.text) if "Content Security Policy" in msg.text else None)
        tab.problems = problems  # type: ignore[attr-defined]
        results: list[str] = []  # every results poll's URL: the page asks for what it shows
        tab.on("request", lambda request: results.append(request.url) if "/results" in request.url else None)
        tab.results = results  # type: ignore[attr-defined]
        yield tab
        context.close()
        browser.close()


def chat(i: int, max_tokens: int = 24, **extra: object) -> dict[str, object]:
    body = {
        "model": "backfill-demo",
        "messages": [{"role": "user", "content": f"def f{i}():"}],
        "max_tokens": max_tokens,
    }
    return {
        "custom_id": f"c{i}",
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {**body, "ignore_eos": True, **extra},
    }


def shot(page: playwright.Page, name: str) -> None:
    """docs/console/<name>.png at the current width, and <name>-360.png on a phone's width."""
    if not SCREENSHOTS:
        return
    DOCS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(DOCS / f"{name}.png"), full_page=True)
    size = page.viewport_size or {"width": 1280, "height": 900}
    page.set_viewport_size({"width": 360, "height": 780})
    page.screenshot(path=str(DOCS / f"{name}-360.png"), full_page=True)
    page.set_viewport_size(size)


def sign_in(page: playwright.Page, base_url: str, key: str) -> None:
    page.goto(f"{base_url}/console")
    page.fill("#key", key)
    page.click("#signin-form button[type=submit]")
    page.wait_for_selector("#nav:not([hidden])")
    assert key not in page.url


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
    page.goto(f"{live.base_url}/console#/batch/{other.id}")
    outcome, status = page.locator("#control-outcome"), page.locator("#batch-status")
    expect(page.locator("#batch-left b")).to_have_text("no deadline")  # a background batch never expires
    control(page, "pause", "Pause: done")
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

    # An admin key also sees the operations charts (with work in the queue) and every tenant's budget.
    page.click("#sign-out")
    sign_in(page, live.base_url, admin_key)
    ops = live.client(admin_key)
    busy = ops.batches.create(  # a long queue: its figure must show whole (1,6xx, not "8 + 1,5")
        input_file_id=upload(ops, to_jsonl([chat(i, max_tokens=900) for i in range(1600)])).id,
        endpoint="/v1/chat/completions",
        completion_window="24h",
    )
    page.click("nav a[data-view=batches]")  # an admin key lists every tenant's batches, each with its tenant
    expect(page.locator("#batches-scope")).to_be_visible()
    expect(page.locator(f"#batch-table tr[data-batch='{other.id}'] .badge.tenant")).to_have_text("acme")
    expect(page.locator(f"#batch-table tr[data-batch='{other.id}'] a")).to_have_count(0)  # opened with acme's key
    expect(page.locator(f"#batch-table tr[data-batch='{busy.id}'] a")).to_have_count(1)
    shot(page, "batches-admin")
    page.click("nav a[data-view=admin]")
    # one row per model; engine busy counters are process-wide, so an earlier test's engines may be listed too
    demo = page.get_by_role("cell", name="backfill-demo", exact=True)  # the demo's -vl and -moderation rows are others'
    expect(page.locator("#overview-table tbody tr").filter(has=demo)).to_have_count(1)
    expect(page.locator("#risk-chart g[data-model=backfill-demo]")).to_have_count(1)
    # the queue's lines show as depth; the busy share needs two polls of the counters while the engine works
    bar_above_zero(page, "#queue-chart g[data-model=backfill-demo]")
    bar_above_zero(page, "#busy-chart g[data-model=backfill-demo]")
    depth = page.locator("#queue-chart g[data-model=backfill-demo]")
    assert int(depth.get_attribute("data-value") or 0) > 1000
    assert depth.locator("text").last.text_content() == f"{int(depth.get_attribute('data-value') or 0):,}"
    assert page.evaluate(FIGURES_INSIDE, "#queue-chart"), "a figure of the queue chart is cut off"
    # the good batch ended: its finish against admission's prediction, on its window's row (issue 40 §3)
    finish = page.locator("#finish-chart g[data-model='24h']")
    expect(finish).to_have_count(1)
    expect(finish.locator("title")).to_have_text(
        re.compile(r"24h: median \d+ (s|min) (late|early)|24h: median on time")
    )
    expect(finish.locator("title")).to_contain_text(re.compile(r"over [1-9]\d* batches \(0 expired\)"))
    assert page.evaluate(FIGURES_INSIDE, "#finish-chart"), "a figure of the finish chart is cut off"
    shot(page, "operations")
    ops.batches.cancel(busy.id)
    page.goto(f"{live.base_url}/console#/batch/{busy.id}")  # 1,600 cancelled lines: the page lists 50 and says so
    expect(page.locator("#error-groups summary")).to_contain_text("the first 50 listed")
    page.click("nav a[data-view=finance]")
    row = page.locator("#budget-table tr[data-tenant=acme]")
    expect(row).to_contain_text("$0.0500")
    expect(row.locator("svg.meter")).to_have_attribute("data-cap", "0.05")
    expect(page.locator("#budget-table tr[data-tenant=globex]")).to_have_count(0)  # no budget, no spend
    shot(page, "finance-admin")
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


FIGURES_INSIDE = """s => { const svg = document.querySelector(s), width = svg.viewBox.baseVal.width;
  return [...svg.querySelectorAll("text")].every(t => { const box = t.getBBox(); return box.x + box.width <= width; }); }"""


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


def bar_above_zero(page: playwright.Page, selector: str) -> None:
    """Wait until the chart's row for a model carries a figure above zero (the page redraws at each poll)."""
    page.wait_for_function(
        "s => { const g = document.querySelector(s); return !!g && Number(g.getAttribute('data-value')) > 0; }",
        arg=selector,
        timeout=WAIT_MS,
    )


def control(page: playwright.Page, action: str, outcome: str) -> None:
    """Press a batch control (the dialog handler confirms it) and wait for the page to show the outcome."""
    page.click(f"#batch-controls button[data-action={action}]")
    playwright.expect(page.locator("#control-outcome")).to_contain_text(outcome)
