"""What the console's browser tests share: Debian's chromium and its flags, the wait for a page state, a chat
line, signing in, and the pages written to docs/console/ with BACKFILL_SCREENSHOTS=1."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

playwright = pytest.importorskip("playwright.sync_api")

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
WAIT_MS = 60_000  # a page state under a loaded CI machine: generous, and only ever waited for, never slept


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
