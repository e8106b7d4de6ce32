"""Cost per LoRA adapter on the finance page and in the console (docs/adapters.md "Cost"), in a real headless
browser: each adapter's lines are a row of their own beside the base model's, with their requests and spend."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from storage.db import transaction
from tests.conftest import Backend, LiveServer, make_key, start_server
from tests.e2e.api.finance.test_page import chromium
from tests.factories import DAY, make_batch, make_request, make_run, make_tenant

CHROMIUM = Path("/usr/bin/chromium")
PRICES = {"prices": [{"model": "fake-model", "effective_from": "2025-01-01", "input_usd_per_mtok": "1",
                      "output_usd_per_mtok": "4"}]}  # fmt: skip
pytestmark = [
    pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Debian's chromium: apt-get install -y chromium"),
    pytest.mark.backfill_env(
        {
            "BACKFILL_MODELS": json.dumps({"fake-model": {"path": "fake:", "enable_lora": True}}),
            "BACKFILL_PRICE_BOOK": json.dumps(PRICES),
        }
    ),
]
LINES = {None: 2, "tone-a": 3, "tone-b": 1}  # adapter -> lines finished today


@pytest.fixture
def server(backend: Backend) -> Iterator[LiveServer]:
    today = int(time.time()) // DAY * DAY
    with transaction() as session:
        tenant = make_tenant(session, "acme")
        run = make_run(session, busy_seconds=10.0, started_at=today + 1)
        batch = make_batch(session, tenant=tenant, created_at=today)
        for adapter, count in LINES.items():
            for _ in range(count):
                row = make_request(session, batch=batch, run=run, prompt_tokens=100, completion_tokens=500,
                                   finished_at=min(time.time(), today + 120))  # fmt: skip
                row.adapter = adapter
    running, stop = start_server(with_worker=False)
    yield running
    stop()


@pytest.mark.parametrize("backend", ["embedded"], indirect=True)
def test_the_finance_page_has_a_row_per_adapter(server: LiveServer) -> None:
    key = make_key("ops", admin=True)
    dom = chromium("--dump-dom", f"{server.base_url}/finance?days=7#key={key}").stdout
    table = dom.split('id="groups-table"')[1].split("</table>")[0]
    assert "<th>adapter</th>" in table
    rows = [row for row in table.split("<tr>")[1:] if "<td>" in row]
    cells = [[cell.split("</td>")[0] for cell in row.split("<td")[1:]] for row in rows]
    by_adapter = {row[2].split(">")[-1]: row[4].split(">")[-1] for row in cells}  # adapter -> requests
    assert by_adapter == {"—": "2", "tone-a": "3", "tone-b": "1"}


@pytest.mark.parametrize("backend", ["embedded"], indirect=True)
def test_the_console_finance_view_shows_cost_per_adapter(server: LiveServer) -> None:
    sync_api = pytest.importorskip("playwright.sync_api")
    key = make_key("acme")
    with sync_api.sync_playwright() as driver:
        browser = driver.chromium.launch(executable_path=str(CHROMIUM), args=["--headless", "--no-sandbox"])
        page = browser.new_page()
        page.set_default_timeout(60_000)
        problems: list[str] = []  # script errors and policy (CSP) refusals: the page must cause none
        page.on("pageerror", lambda error: problems.append(f"page error: {error}"))
        page.on("console", lambda msg: problems.append(msg.text) if "Content Security Policy" in msg.text else None)
        page.goto(f"{server.base_url}/console")
        page.fill("#key", key)
        page.click("#signin-form button[type=submit]")
        page.wait_for_selector("#nav:not([hidden])")
        page.click("nav a[data-view=finance]")
        page.wait_for_selector("#adapter-cost-table tbody tr")
        rows = page.locator("#adapter-cost-table tbody tr")
        found = {
            rows.nth(i).get_attribute("data-adapter"): rows.nth(i).locator("td").nth(2).inner_text()
            for i in range(rows.count())
        }
        billed = [rows.nth(i).locator("td").nth(4).inner_text() for i in range(rows.count())]
        browser.close()
    assert found == {"": "2", "tone-a": "3", "tone-b": "1"}  # "": the base model's lines
    assert billed[0] != "$0.0000" and not problems
