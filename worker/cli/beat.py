"""`backfill beat`: the periodic jobs (lease reaper, expiry, wake-ups) on Celery beat."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from storage.settings import get_settings


def register(subparsers: Any) -> None:
    """Add the `beat` subcommand."""
    parser = subparsers.add_parser("beat", help="run the periodic jobs (lease reaper, expiry, wake-ups)")
    parser.add_argument(
        "--metrics-port", type=int, help="serve /metrics on this port (default BACKFILL_METRICS_PORT; 0: off)"
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Run Celery beat with its schedule file under data_dir."""
    settings = get_settings()
    if settings.redis_url is None:
        print("backfill: BACKFILL_REDIS_URL must be set to run beat", file=sys.stderr)
        return 2
    from storage.metrics import serve_metrics
    from worker.process.celery_app import app

    serve_metrics(settings.metrics_port if args.metrics_port is None else args.metrics_port, role="beat")
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    app.start(["beat", "--loglevel", "INFO", "-s", str(settings.data_dir / "celerybeat-schedule")])
    return 0
