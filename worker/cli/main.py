"""The `backfill` command: serve, migrate, keys, tenants, worker, beat, demo-model, plan, estimate, report; and the
client commands for a remote server: submit, batches, files, webhooks.

This package is the composition root: the one place that wires the API, storage and worker together
for a process. Each command lives in its own module with `register(subparsers)`; they are imported
here directly, so a command that fails to import stops the CLI loudly instead of vanishing.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

from client import batches, files, submit, webhooks
from storage.settings import SettingsError, get_settings
from worker.cli import beat, demo_model, estimate, keys, migrate, plan, report, serve, tenants, worker

COMMANDS = (
    serve,
    migrate,
    keys,
    tenants,
    worker,
    beat,
    demo_model,
    plan,
    estimate,
    report,
    submit,
    batches,
    files,
    webhooks,
)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `backfill` console script."""
    configure_logging()
    parser = build_parser()
    args = parser.parse_args(argv)
    if not hasattr(args, "func"):
        parser.print_help()
        return 2
    try:
        get_settings()
        return int(args.func(args))
    except SettingsError as error:
        print(f"backfill: {error}", file=sys.stderr)
        return 2


def configure_logging() -> None:
    """BACKFILL_LOG_LEVEL on the root logger; SQL statements stay silent at any level unless BACKFILL_SQL_ECHO.

    SQL is logged with its parameters (tenant ids, API key hashes): never part of ordinary logs.
    """
    logging.basicConfig(
        level=os.environ.get("BACKFILL_LOG_LEVEL", "INFO"), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    echo = os.environ.get("BACKFILL_SQL_ECHO", "").lower() in {"1", "true", "yes", "on"}
    logging.getLogger("sqlalchemy.engine").setLevel(logging.INFO if echo else logging.WARNING)
    from api.logs import RedactSecrets

    for handler in logging.getLogger().handlers:
        handler.addFilter(RedactSecrets())


def build_parser() -> argparse.ArgumentParser:
    """All subcommands; each has --help."""
    parser = argparse.ArgumentParser(prog="backfill", description="Self-hosted, OpenAI-compatible Batch API.")
    sub = parser.add_subparsers(title="commands", metavar="COMMAND")
    for command in COMMANDS:
        command.register(sub)
    return parser
