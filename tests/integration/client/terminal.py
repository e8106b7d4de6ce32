"""Run the real `backfill` command in a pseudo-terminal, as a person at a shell would, and read its screen.

The child gets the pty as its controlling terminal (`setsid -c`), so a typed Ctrl-C (\\x03) reaches it as
SIGINT through the terminal's line discipline, exactly as at a keyboard.
"""

from __future__ import annotations

import fcntl
import os
import re
import select
import signal
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]  # the checkout: its code, not an installed one
ANSI = re.compile(rb"\x1b\[[0-9;?]*[A-Za-z]")


def cli_env(base_url: str, key: str | None, data_dir: Path) -> dict[str, str]:
    """The environment of a user's shell: the server's URL and key, nothing else of the test's settings."""
    env = {name: value for name, value in os.environ.items() if not name.startswith(("BACKFILL_", "OPENAI_"))}
    env.update({"PYTHONPATH": str(ROOT), "BACKFILL_BASE_URL": base_url, "BACKFILL_DATA_DIR": str(data_dir)})
    if key is not None:
        env["BACKFILL_API_KEY"] = key
    return env


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class Terminal:
    """`backfill ARGS` on a 40x160 pty; `expect` waits for text on the screen, `type` sends keystrokes."""

    def __init__(self, args: list[str], *, env: dict[str, str], cwd: Path) -> None:
        master, slave = os.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 160, 0, 0))
        self.process = subprocess.Popen(
            ["setsid", "-w", "-c", sys.executable, "-m", "worker.cli", *args],
            stdin=slave,
            stdout=slave,
            stderr=slave,
            env=env,
            cwd=cwd,
            close_fds=True,
            # As a shell starts a foreground job: Ctrl-C's SIGINT acts, even where this test runs under a
            # non-interactive shell's `&`, whose children inherit SIGINT ignored (and exec keeps it ignored).
            preexec_fn=_default_sigint,
        )
        os.close(slave)
        self.master = master
        self.raw = bytearray()

    @property
    def text(self) -> str:
        """Everything printed so far, without colour codes; carriage returns kept (bars redraw with them)."""
        return ANSI.sub(b"", bytes(self.raw)).decode(errors="replace")

    def _read(self, timeout: float) -> bool:
        ready, _, _ = select.select([self.master], [], [], timeout)
        if not ready:
            return True
        try:
            chunk = os.read(self.master, 65536)
        except OSError:  # EIO: the child closed the terminal
            return False
        self.raw += chunk
        return bool(chunk)

    def expect(self, pattern: str, timeout: float = 60) -> re.Match[str]:
        """Wait until `pattern` (a regex) appears in the output."""
        deadline = time.time() + timeout
        while True:
            match = re.search(pattern, self.text)
            if match:
                return match
            if time.time() > deadline:
                raise AssertionError(f"{pattern!r} not on the screen after {timeout} s:\n{self.text[-3000:]}")
            if not self._read(0.2) and self.process.poll() is not None:
                raise AssertionError(f"exited {self.process.returncode} before {pattern!r}:\n{self.text[-3000:]}")

    def type(self, keys: str) -> None:
        os.write(self.master, keys.encode())

    def wait(self, timeout: float = 60) -> int:
        """Read to the end; the exit code."""
        deadline = time.time() + timeout
        while self._read(0.2) or self.process.poll() is None:
            if time.time() > deadline:
                self.process.kill()
                raise AssertionError(f"still running after {timeout} s:\n{self.text[-3000:]}")
        os.close(self.master)
        return self.process.wait()


def run_cli(
    args: list[str], *, env: dict[str, str], cwd: Path, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """`backfill ARGS` with plain pipes (no terminal), as a script would run it."""
    return subprocess.run(
        [sys.executable, "-m", "worker.cli", *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout
    )
