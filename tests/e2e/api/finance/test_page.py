"""The finance page in a real headless browser: it loads the reports with a key and draws them as SVG."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path

import httpx
import pytest

from storage.db import transaction
from tests.conftest import Backend, LiveServer, make_key, start_server
from tests.e2e.console.browser import CHROMIUM, FLAGS
from tests.factories import DAY, make_batch, make_request, make_run, make_tenant

pytestmark = [
    pytest.mark.skipif(
        not CHROMIUM.exists(),
        reason="needs Debian's chromium for a real browser: apt-get update && apt-get install -y chromium",
    ),
    pytest.mark.backfill_env({"BACKFILL_MODELS": '{"fake-model": {"path": "fake:"}}'}),
]
DATA_DAYS = 3


@pytest.fixture
def server(backend: Backend) -> Iterator[LiveServer]:
    server, stop = start_server(with_worker=False)
    yield server
    stop()


def seed_three_days() -> set[str]:
    """Jobs for two tenants on each of the last three UTC days; returns those days as ISO dates."""
    today = int(time.time()) // DAY * DAY
    days = set()
    with transaction() as session:
        tenants = [make_tenant(session, "acme"), make_tenant(session, "globex")]
        for back in range(DATA_DAYS):
            day = today - back * DAY
            days.add(time.strftime("%Y-%m-%d", time.gmtime(day)))
            run = make_run(session, busy_seconds=20.0 + back, started_at=day + 60)
            for tenant in tenants:
                batch = make_batch(session, tenant=tenant, created_at=day)
                for index in range(5):
                    make_request(
                        session,
                        batch=batch,
                        run=run,
                        prompt_tokens=400,
                        completion_tokens=900 + index,
                        finished_at=day + 120,
                    )
    return days


def chromium(*args: str) -> subprocess.CompletedProcess[str]:
    profile = tempfile.mkdtemp(prefix="chromium-")
    try:
        return subprocess.run(
            [
                str(CHROMIUM),
                *FLAGS,
                f"--user-data-dir={profile}",
                "--window-size=1280,900",
                "--virtual-time-budget=10000",  # let the page's fetches finish before the dump or screenshot
                *args,
            ],
            capture_output=True,
            text=True,
            timeout=90,
            check=True,
        )
    finally:
        shutil.rmtree(profile, ignore_errors=True)


class ChartPoints(HTMLParser):
    """Collects the data points (class="point") of every <svg id=...> in a dumped DOM."""

    def __init__(self) -> None:
        super().__init__()
        self.svg: str | None = None
        self.points: dict[str, list[dict[str, str | None]]] = {}

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        if tag == "svg":
            self.svg = found.get("id")
            self.points.setdefault(self.svg or "", [])
        elif self.svg and "point" in (found.get("class") or "").split():
            self.points[self.svg].append(found)

    def handle_endtag(self, tag: str) -> None:
        if tag == "svg":
            self.svg = None


@pytest.mark.parametrize("backend", ["embedded"], indirect=True)
def test_finance_page_draws_daily_costs_and_the_planner_curve(server: LiveServer, tmp_path: Path) -> None:
    days = seed_three_days()
    key = make_key("ops", admin=True)
    url = f"{server.base_url}/finance?days=7#key={key}"
    screenshot = tmp_path / "finance.png"

    chromium(f"--screenshot={screenshot}", url)
    dom = chromium("--dump-dom", url).stdout

    image = pytest.importorskip("PIL.Image").open(screenshot).convert("RGB")
    assert image.size == (1280, 900)
    colours = image.getcolors(maxcolors=1 << 20) or []
    assert len(colours) > 50, "the screenshot is blank"
    assert any(abs(r - 0x2F) + abs(g - 0x6F) + abs(b - 0xDE) < 30 for _, (r, g, b) in colours), "no billed bars"

    charts = ChartPoints()
    charts.feed(dom)
    daily = charts.points["chart-daily"]
    assert {p["data-series"] for p in daily} == {"list", "billed", "compute"}
    assert {p["data-day"] for p in daily if float(p["data-value"] or 0) > 0} == days
    assert len(charts.points["chart-margin"]) == 2 * 7
    plan = httpx.get(f"{server.base_url}/v1/planner", headers={"Authorization": f"Bearer {key}"}).json()
    assert len(charts.points["chart-planner"]) == sum(row["fits"] for row in plan["rows"]) > 3
    assert "No data" not in dom.split('id="days-table"')[1].split("</table>")[0]


@pytest.mark.parametrize("backend", ["embedded"], indirect=True)
def test_finance_page_without_a_key_asks_for_one_and_draws_nothing(server: LiveServer) -> None:
    dom = chromium("--dump-dom", f"{server.base_url}/finance").stdout

    charts = ChartPoints()
    charts.feed(dom)
    assert "Enter an API key" in dom
    assert not any(charts.points.values())
