"""A real `backfill worker` process for tests of the Celery deployment, its output in a log file."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def start_worker(args: list[str], *, env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    """`backfill worker ARGS` in its own session (so a test can signal or kill its whole group)."""
    return subprocess.Popen(
        [sys.executable, "-m", "worker.cli", "worker", *args],
        env=env,
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
        cwd=ROOT,
        start_new_session=True,
    )
