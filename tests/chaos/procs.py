"""Child processes of the chaos harness: each in its own process group, and none outlives the harness.

Every child is started with `start_new_session=True` (its own session and process group, so a kill -9
takes its whole tree) and, where `setpriv` exists, with a parent-death signal, so even a harness that is
itself killed -9 leaves nothing running on the shared machine. Children are spawned from the main thread
only: Linux delivers the parent-death signal when the *thread* that forked the child exits.
"""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

_SETPRIV = shutil.which("setpriv")
_live: dict[int, Child] = {}
_live_lock = threading.Lock()


def free_port() -> int:
    """A TCP port nobody listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_port(port: int, *, timeout: float, child: Child | None = None) -> None:
    """Wait until something accepts connections on 127.0.0.1:`port`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if child is not None and not child.alive():
            raise RuntimeError(f"{child.name} exited with {child.returncode()} before listening; see {child.log}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listens on port {port} after {timeout} s")


@dataclass
class Child:
    """One restartable child process; each start appends to its own numbered log file."""

    name: str
    argv: list[str]
    env: dict[str, str]
    log_dir: Path
    cwd: Path | None = None
    user: str | None = None  # run as this user (Postgres refuses to run as root)
    ready_marker: str | None = None  # a log line that says the process is in service
    starts: int = 0
    popen: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def log(self) -> Path:
        return self.log_dir / f"{self.name}.{self.starts}.log"

    def start(self) -> None:
        """Start (or restart) the process in a new process group."""
        if threading.current_thread() is not threading.main_thread():
            raise RuntimeError("children are spawned from the main thread only (parent-death signal)")
        if self.alive():
            raise RuntimeError(f"{self.name} is already running")
        self.starts += 1
        prefix: list[str] = []
        if _SETPRIV is not None:
            prefix = [_SETPRIV]
            if self.user is not None:
                prefix += ["--reuid", self.user, "--regid", self.user, "--init-groups"]
            prefix += ["--pdeathsig", "KILL", "--"]
        elif self.user is not None:
            prefix = ["runuser", "-u", self.user, "--"]
        self.log_dir.mkdir(parents=True, exist_ok=True)
        with self.log.open("ab") as out:
            self.popen = subprocess.Popen(
                [*prefix, *self.argv],
                env=self.env,
                cwd=self.cwd,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        with _live_lock:
            _live[self.popen.pid] = self

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def ready(self) -> bool:
        """Alive, and (if it has a marker) its current log says it is in service."""
        if not self.alive():
            return False
        if self.ready_marker is None:
            return True
        try:
            return self.ready_marker in self.log.read_text(errors="replace")
        except OSError:
            return False

    def returncode(self) -> int | None:
        return None if self.popen is None else self.popen.poll()

    def kill(self) -> None:
        """kill -9 the whole process group and reap it."""
        if self.popen is None:
            return
        _killpg(self.popen.pid, signal.SIGKILL)
        try:
            self.popen.wait(15)
        except subprocess.TimeoutExpired:  # pragma: no cover - a zombie we cannot reap
            pass
        with _live_lock:
            _live.pop(self.popen.pid, None)

    def terminate(self, *, timeout: float) -> int | None:
        """SIGTERM the process itself (as Kubernetes signals a container's PID 1) and wait up to `timeout` for it
        to exit; kill -9 what is left of its group either way. Its exit status, or None if it had to be killed."""
        if self.popen is None:
            return None
        try:
            os.kill(self.popen.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        code = self.wait(timeout)
        self.kill()
        return code

    def wait(self, timeout: float) -> int | None:
        """Wait for a process that is stopping by itself; None if it did not stop in time."""
        if self.popen is None:
            return None
        try:
            code = self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            return None
        with _live_lock:
            _live.pop(self.popen.pid, None)
        return code

    def tail(self, chars: int = 3000) -> str:
        """The end of the current log (for failure messages)."""
        try:
            return self.log.read_text(errors="replace")[-chars:]
        except OSError:
            return ""


def _killpg(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def kill_all() -> None:
    """kill -9 every process group this harness started and still knows about."""
    with _live_lock:
        children = list(_live.values())
    for child in children:
        child.kill()


def live_children() -> list[str]:
    """Names of the children still running (a test asserts none is left)."""
    with _live_lock:
        return [child.name for child in _live.values() if child.alive()]


atexit.register(kill_all)
