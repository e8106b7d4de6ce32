"""`backfill beat`: the periodic jobs (lease reaper, expiry, wake-ups) on Celery beat."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from storage.settings import get_settings


def register(subparsers: Any) -> None:
    """Add the `beat` subcommand."""
    parser = subparsers.add_parser("beat", help="run the periodic jobs (lease reaper, expiry, wake-ups)")
    parser.set_defaults(func=run)


def run(_: argparse.Namespace) -> int:
    """Run Celery beat with its schedule file under data_dir."""
    settings = get_settings()
    if settings.redis_url is None:
        print("backfill: BACKFILL_REDIS_URL must be set to run beat", file=sys.stderr)
        return 2
    from worker.celery_app import app

    settings.data_dir.mkdir(parents=True, exist_ok=True)
    app.start(["beat", "--loglevel", "INFO", "-s", str(settings.data_dir / "celerybeat-schedule")])
    return 0
