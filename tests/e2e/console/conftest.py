"""The console on the real vLLM engine, for the tenant's and the admin's browser tests: a live server with a price
book and webhook deliveries to this machine, its engine loaded first, a receiver, and a chromium tab.

test_console_media.py and test_console_workflow.py run on the fake engine: they define their own `live` and `page`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import LiveServer, make_key, start_server
from tests.e2e.console.browser import CHROMIUM, FLAGS, WAIT_MS, chat, playwright
from tests.integration.api.helpers import to_jsonl, upload, wait_for
from tests.integration.receiver import WEBHOOK_TEST_ENV, Receiver, running_receiver

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
