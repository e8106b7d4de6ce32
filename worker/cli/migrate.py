"""`backfill migrate`: apply the Alembic migrations to the configured database."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def register(subparsers: Any) -> None:
    """Add the `migrate` subcommand."""
    parser = subparsers.add_parser("migrate", help="apply database migrations")
    parser.set_defaults(func=run)


def migrate_database() -> None:
    """Upgrade the configured database to the newest migration."""
    from alembic import command
    from alembic.config import Config

    config = Config(str(ROOT / "alembic.ini"))
    config.set_main_option("script_location", str(ROOT / "migrations"))
    command.upgrade(config, "head")


def run(_: argparse.Namespace) -> int:
    """Migrate and say so."""
    migrate_database()
    print("database is up to date")
    return 0
