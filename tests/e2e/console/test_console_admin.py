"""The console in a real headless browser on the real vLLM engine: an admin key lists every tenant's batches, each
with its tenant, and sees the operations charts (a long queue's figure whole, the finish against admission's
prediction) and every tenant's budget. The tenant's pages: test_console_tenant.py.

Every wait is for a state the page shows (generous timeouts, no fixed sleeps); engine busy counters are
process-wide, so the charts are read by model name.
"""

from __future__ import annotations

import re

import httpx
import pytest

from tests.conftest import LiveServer, make_key
from tests.e2e.console.browser import CHROMIUM, WAIT_MS, chat, playwright, shot, sign_in
from tests.integration.api.helpers import to_jsonl, upload, wait_for

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Debian's chromium: infra/local/services.sh installs it"),
]


def test_an_admin_sees_every_tenants_batches_the_operations_charts_and_every_budget(
    live: LiveServer, page: playwright.Page
) -> None:
    expect = playwright.expect
    expect.set_options(timeout=WAIT_MS)
    key, admin_key = make_key("acme"), make_key("ops", admin=True)
    make_key("globex")  # a second tenant, with no budget and no spend
    # A tenant's batch, ended in the 24h window (the finish chart's row), and the tenant's monthly budget.
    client = live.client(key)
    other = client.batches.create(
        input_file_id=upload(client, to_jsonl([chat(i) for i in range(4)])).id,
        endpoint="/v1/chat/completions",
        completion_window="24h",
    )
    wait_for(client, other.id, timeout=300)
    httpx.post(
        f"{live.base_url}/v1/organization/budgets",
        json={"tenant": "acme", "monthly_budget_usd": "0.05"},
        headers={"Authorization": f"Bearer {admin_key}"},
    ).raise_for_status()

    # An admin key also sees the operations charts (with work in the queue) and every tenant's budget.
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
    # acme's batch ended: its finish against admission's prediction, on its window's row (issue 40 §3)
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


FIGURES_INSIDE = """s => { const svg = document.querySelector(s), width = svg.viewBox.baseVal.width;
  return [...svg.querySelectorAll("text")].every(t => { const box = t.getBBox(); return box.x + box.width <= width; }); }"""


def bar_above_zero(page: playwright.Page, selector: str) -> None:
    """Wait until the chart's row for a model carries a figure above zero (the page redraws at each poll)."""
    page.wait_for_function(
        "s => { const g = document.querySelector(s); return !!g && Number(g.getAttribute('data-value')) > 0; }",
        arg=selector,
        timeout=WAIT_MS,
    )
