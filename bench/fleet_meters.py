"""What bench/fleet.py reads off the database server and the machine during a stage."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import sqlalchemy as sa

TICKS = os.sysconf("SC_CLK_TCK")


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (nearest rank); 0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered)) - 1))]


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU of these processes (all their threads), in seconds."""
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])
    return total / TICKS


def postgres_pids() -> list[int]:
    """Every process of the Postgres server (the postmaster, backends, WAL writer, checkpointer...)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if (entry / "comm").read_text().strip() in ("postgres", "postmaster"):
                    pids.append(int(entry.name))
            except OSError:
                continue
    return pids


class Meters:
    """The database's and the simulator's figures over a window of wall time."""

    def __init__(self, url: str, simulator_pids: list[int]) -> None:
        self.engine = sa.create_engine(
            url.replace("postgresql://", "postgresql+psycopg://"), isolation_level="AUTOCOMMIT"
        )
        self.simulator = simulator_pids

    def _db(self) -> dict[str, Any]:
        with self.engine.connect() as conn:
            lsn = conn.execute(sa.text("SELECT pg_current_wal_lsn()")).scalar_one()
            row = conn.execute(
                sa.text(
                    "SELECT xact_commit, tup_inserted + tup_updated + tup_deleted FROM pg_stat_database"
                    " WHERE datname = current_database()"
                )
            ).one()
            connections = conn.execute(
                sa.text("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()")
            ).scalar_one()
        return {"lsn": lsn, "xacts": int(row[0]), "rows": int(row[1]), "connections": int(connections)}

    def backends(self) -> list[int]:
        """The server processes of this database's connections (the simulator's pool): the CPU Postgres spends on
        the fleet, not on other databases of the same server."""
        with self.engine.connect() as conn:
            query = "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
            return [int(pid) for (pid,) in conn.execute(sa.text(query))]

    def window(self, seconds: float) -> dict[str, Any]:
        """Measure `seconds` of wall time from now."""
        pg = self.backends()
        server = postgres_pids()
        server_cpu = cpu_seconds(server)
        before, pg_cpu, sim_cpu = self._db(), cpu_seconds(pg), cpu_seconds(self.simulator)
        began = time.monotonic()
        connections = [before["connections"]]
        while time.monotonic() - began < seconds:
            time.sleep(min(1.0, seconds - (time.monotonic() - began)))
            connections.append(self._db()["connections"])
        ended = time.monotonic()
        after = self._db()
        pg_used = cpu_seconds(pg) - pg_cpu  # connections are pooled: the same backends from start to end
        server_used = cpu_seconds(server) - server_cpu
        sim_used = cpu_seconds(self.simulator) - sim_cpu
        wall = ended - began
        with self.engine.connect() as conn:
            wal = conn.execute(
                sa.text("SELECT pg_wal_lsn_diff(CAST(:b AS pg_lsn), CAST(:a AS pg_lsn))"),
                {"a": before["lsn"], "b": after["lsn"]},
            ).scalar_one()
            queued = conn.execute(sa.text("SELECT count(*) FROM batch_requests WHERE status = 'queued'")).scalar_one()
        cores = os.cpu_count() or 1
        return {
            "began": began,
            "ended": ended,
            "wal_mb_per_s": round(float(wal) / wall / 1e6, 2),
            "transactions_per_s": round((after["xacts"] - before["xacts"]) / wall),
            "rows_written_per_s": round((after["rows"] - before["rows"]) / wall),
            "connections": max(connections),
            "postgres_cpu_share": round(pg_used / wall / cores, 3),
            "postgres_cpu_seconds": round(pg_used, 2),
            "server_cpu_share": round(server_used / wall / cores, 3),  # every database of the server
            "simulator_cpu_share": round(sim_used / wall / cores, 3),
            "load_average": round(os.getloadavg()[0], 2),
            "db_queued": int(queued),
        }

    def final_checks(self) -> dict[str, Any]:
        """After the fleet stopped: rows claimed more than once, results stored, rows left running."""
        with self.engine.connect() as conn:
            row = conn.execute(
                sa.text(
                    "SELECT count(*) FILTER (WHERE attempts > 1), count(*) FILTER (WHERE status = 'completed'),"
                    " count(*) FILTER (WHERE status = 'running') FROM batch_requests"
                )
            ).one()
        self.engine.dispose()
        return {"attempts_over_1": int(row[0]), "completed": int(row[1]), "running_at_stop": int(row[2])}
