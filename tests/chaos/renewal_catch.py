"""Times a Postgres stop to a lease renewal (the `pg_stop_renewal` fault, tests/chaos/faults.py).

A worker renews its leases in one short transaction (storage/queue/leases.py `renew`: periodic checkpoints of its
rows, a read of its running rows, then one `UPDATE leases SET expires_at …` of the claims' leases), every 2 s
while it runs rows. A stop at a random moment rarely lands inside one, so the harness makes it land there: it
locks every lease row (`SELECT … FOR UPDATE SKIP LOCKED`, in a transaction of its own), which a claim (it inserts
new leases) and the reaper (it skips locked leases) pass by but a renewal's UPDATE waits on, and polls
`pg_stat_activity` until a renewal waits on those locks. Postgres is then stopped (`-m immediate`) with the
renewal's transaction open: its checkpoint writes and lease update never commit, and the worker's next renewal
meets a database that was away, and came back after its leases expired.
"""

from __future__ import annotations

import time

import psycopg

# A renewal is the only statement that moves a lease's expiry (storage/queue/lease_expiry.py `extend`).
RENEWAL_PREFIX = "UPDATE leases SET expires_at"
CATCH_SECONDS = 20.0  # no renewal waited on the locks by then (nothing running): stop anyway, and say so

_BLOCKED_RENEWALS = """
    SELECT pid FROM pg_stat_activity
    WHERE datname = current_database() AND query LIKE %s AND pg_backend_pid() = ANY(pg_blocking_pids(pid))
"""


class RenewalCatch:
    """Holds the run's lease rows locked until a worker's renewal waits on them."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.started = time.monotonic()
        self._conn: psycopg.Connection | None = None
        self._locked = 0

    def poll(self) -> str | None:
        """What to log once the stop may go (a renewal caught, or none in CATCH_SECONDS); None: keep waiting.

        Postgres may be away (another fault): the locks are then gone with it, and taken again once it is back."""
        try:
            caught = self._caught()
        except psycopg.Error:
            self.close()
            caught = None
        if caught:
            return f"a renewal (backend {caught[0]}) waiting on {self._locked} locked leases"
        if time.monotonic() - self.started >= CATCH_SECONDS:
            return f"no renewal caught in {CATCH_SECONDS:.0f} s"
        return None

    def _caught(self) -> list[int]:
        if self._conn is None:
            conn = psycopg.connect(self.url, connect_timeout=1)
            locked = conn.execute("SELECT id FROM leases FOR UPDATE SKIP LOCKED").fetchall()
            if not locked:  # nothing running under a lease yet
                conn.close()
                return []
            self._conn, self._locked = conn, len(locked)
        self._conn.execute("SELECT pg_stat_clear_snapshot()")  # activity is read afresh, not as of the first read
        return [pid for (pid,) in self._conn.execute(_BLOCKED_RENEWALS, (RENEWAL_PREFIX + "%",)).fetchall()]

    def close(self) -> None:
        """Let the locks go (after the stop: the connection is already gone)."""
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.close()
            except psycopg.Error:
                pass
