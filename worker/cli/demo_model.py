"""`backfill demo-model PATH`: build the tiny offline demo model."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any


def register(subparsers: Any) -> None:
    """Add the `demo-model` subcommand."""
    parser = subparsers.add_parser("demo-model", help="build the tiny offline demo model into PATH")
    parser.add_argument("path", type=Path)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Build it and print where."""
    from worker.engine.demo_model import build_demo_model

    path = build_demo_model(args.path)
    print(f"demo model ready at {path}")
    return 0
