"""The console in a real headless browser (Debian's chromium, driven by playwright) on the real vLLM engine.

Sign in, upload a file with bad lines and see them by number, create a batch, watch its progress bar move,
open its errors, download its output, cancel another batch; a second tenant sees none of it. With
BACKFILL_SCREENSHOTS=1 each page is written to docs/console/ (desktop and 360 px wide).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import LiveServer, make_key, start_server
from tests.integration.api.helpers import to_jsonl, upload, wait_for

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
def page(live: LiveServer) -> Iterator[playwright.Page]:
    with playwright.sync_playwright() as driver:
        browser = driver.chromium.launch(executable_path=str(CHROMIUM), args=FLAGS)
        context = browser.new_context(viewport={"width": 1280, "height": 900}, accept_downloads=True)
        tab = context.new_page()
        tab.on("dialog", lambda dialog: dialog.accept())  # the controls ask for confirmation
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


def test_a_tenant_uploads_watches_reads_errors_downloads_and_cancels(
    live: LiveServer, page: playwright.Page, tmp_path: Path
) -> None:
    expect = playwright.expect
    key, other_key = make_key("acme"), make_key("globex")
    sign_in(page, live.base_url, key)
    shot(page, "signin-empty")

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

    # A good file (one line the engine refuses) becomes a batch; its progress bar moves on the real engine.
    lines = [chat(i) for i in range(40)] + [chat(98, temperature=-3)]
    good = tmp_path / "good.jsonl"
    good.write_bytes(to_jsonl(lines))
    page.set_input_files("#upload-file", str(good))
    page.fill("#upload-metadata", '{"project": "console-e2e"}')
    page.click("#upload-check")
    expect(page.locator("#upload-create")).to_be_enabled()
    page.click("#upload-create")
    page.wait_for_url("**/console#/batch/batch_*")
    bar = page.locator("#batch-progress svg.bar")
    seen: set[int] = set()
    deadline = time.time() + 120
    while time.time() < deadline and page.locator("#batch-status").text_content() != "completed":
        seen.add(int(bar.get_attribute("data-done") or 0))
        page.wait_for_timeout(250)
    assert page.locator("#batch-status").text_content() == "completed"
    assert any(0 < done < 40 for done in seen), f"the bar never showed partial progress: {sorted(seen)}"
    expect(bar).to_have_attribute("data-done", "40")
    expect(bar).to_have_attribute("data-failed", "1")

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

    # Another batch, cancelled from the console.
    client = live.client(key)
    other = client.batches.create(
        input_file_id=upload(client, to_jsonl([chat(i, max_tokens=900) for i in range(8)])).id,
        endpoint="/v1/chat/completions",
        completion_window="24h",
    )
    page.goto(f"{live.base_url}/console#/batch/{other.id}")
    page.click("#batch-controls button[data-action=cancel]")
    expect(page.locator("#control-outcome")).to_contain_text("Cancel: done")
    expect(page.locator("#batch-status")).to_have_text("cancelled", timeout=30_000)

    page.click("nav a[data-view=batches]")
    expect(page.locator("#batch-table tbody tr")).to_have_count(2)
    page.fill("#filter-q", "console-e2e")
    page.click("#batch-filter button")
    expect(page.locator("#batch-table tbody tr")).to_have_count(1)
    page.fill("#filter-q", "")
    page.click("#batch-filter button")
    expect(page.locator("#batch-table tbody tr")).to_have_count(2)
    shot(page, "batches")
    for view in ("files", "webhooks", "finance"):
        page.click(f"nav a[data-view={view}]")
        page.wait_for_timeout(500)
        shot(page, view)

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
    expect(page.locator("#file-table tbody tr")).to_have_count(0)
    expect(page.locator("#nav-admin")).to_be_hidden()

    # An admin key also sees the operations view.
    page.click("#sign-out")
    sign_in(page, live.base_url, make_key("ops", admin=True))
    page.click("nav a[data-view=admin]")
    # one row per model; engine busy counters are process-wide, so an earlier test's engines may be listed too
    expect(page.locator("#overview-table tbody tr", has_text="backfill-demo")).to_have_count(1)
    page.wait_for_timeout(3500)  # a second poll gives the engine's busy share
    shot(page, "operations")
