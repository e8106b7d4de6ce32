"""Times a Postgres stop to a lease renewal (the `pg_stop_renewal` fault, tests/chaos/faults.py).

A worker renews its leases in one short transaction (storage/queue/leases.py `renew`: periodic checkpoints of its
rows, a read of its running rows, then one `UPDATE leases SET expires_at …` of the claims' leases), every 2 s
while it runs rows. A stop at a random moment rarely lands inside one, so the harness makes it land there: it
locks every lease row (`SELECT … FOR UPDATE SKIP LOCKED`, in a transaction of its own, again at each poll for the
leases claims made since), which a claim (it inserts new leases) and the reaper (it skips locked leases) pass by but
a renewal's UPDATE (or its drop of its empty leases) waits on, and polls `pg_stat_activity` until a renewal waits
on those locks. Postgres is then stopped (`-m immediate`) with the renewal's transaction open: its checkpoint writes
and lease update never commit, and the worker's next renewal meets a database that was away, and came back after
its leases expired.
"""

from __future__ import annotations

import time

import psycopg

# A renewal's two lease statements (storage/queue/lease_expiry.py): `extend` (the only statement that moves a lease's
# expiry) and `drop_empty` (this worker's leases no running row points to any more; the reaper's deletes name
# leases by id or workers by a list).
RENEWAL_PREFIXES = ("UPDATE leases SET expires_at", "DELETE FROM leases WHERE leases.worker_id = ")
CATCH_SECONDS = 20.0  # no renewal waited on the locks by then (nothing running): stop anyway, and say so

_BLOCKED_RENEWALS = """
    SELECT pid, query FROM pg_stat_activity
    WHERE datname = current_database() AND (query LIKE %s OR query LIKE %s)
      AND pg_backend_pid() = ANY(pg_blocking_pids(pid))
"""
_LOCK_LEASES = "SELECT id FROM leases FOR UPDATE SKIP LOCKED"


class RenewalCatch:
    """Holds the run's lease rows locked until a worker's renewal waits on them."""

    def __init__(self, url: str, *, trigger: str = "") -> None:
        self.url = url
        self.trigger = trigger  # what set it off (the fault's trigger, as it first held)
        self.started = time.monotonic()
        self._conn: psycopg.Connection | None = None
        self._locked: set[str] = set()

    def poll(self) -> str | None:
        """What to log once the stop may go (a renewal caught, or none in CATCH_SECONDS); None: keep waiting.

        Postgres may be away (another fault): the locks are then gone with it, and taken again once it is back."""
        try:
            caught = self._caught()
        except psycopg.Error:
            self.close()
            caught = None
        if caught:
            pid, statement = caught[0]
            step = "its lease update" if statement.startswith(RENEWAL_PREFIXES[0]) else "its drop of empty leases"
            return f"a renewal (backend {pid}) waiting at {step} on {len(self._locked)} locked leases"
        if time.monotonic() - self.started >= CATCH_SECONDS:
            return f"no renewal caught in {CATCH_SECONDS:.0f} s"
        return None

    def _caught(self) -> list[tuple[int, str]]:
        """Lock the leases committed since the last poll too (a renewal moves its worker's current claims' leases,
        and drops the finished ones'), then look for a renewal waiting on them."""
        conn = self._conn or psycopg.connect(self.url, connect_timeout=1)
        self._conn = conn
        self._locked |= {lease_id for (lease_id,) in conn.execute(_LOCK_LEASES).fetchall()}
        if not self._locked:  # nothing running under a lease yet
            return []
        conn.execute("SELECT pg_stat_clear_snapshot()")  # activity is read afresh, not as of the first read
        patterns = tuple(prefix + "%" for prefix in RENEWAL_PREFIXES)
        return [(pid, query) for pid, query in conn.execute(_BLOCKED_RENEWALS, patterns).fetchall()]

    def close(self) -> None:
        """Let the locks go (after the stop: the connection is already gone)."""
        conn, self._conn, self._locked = self._conn, None, set()
        if conn is not None:
            try:
                conn.close()
            except psycopg.Error:
                pass
