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


def server_pids(postmaster: int | None) -> list[int]:
    """A server's processes: every Postgres process of the machine (None), or one cluster's postmaster and all its
    descendants (a shard's own server, bench/fleet_shards.py)."""
    if postmaster is None:
        return postgres_pids()
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(parent, []).append(int(entry.name))
    pids, todo = [], [postmaster]
    while todo:
        pid = todo.pop()
        pids.append(pid)
        todo += children.get(pid, [])
    return pids


class Meters:
    """The database's and the simulator's figures over a window of wall time."""

    def __init__(self, url: str, simulator_pids: list[int], postmaster: int | None = None) -> None:
        self.engine = sa.create_engine(
            url.replace("postgresql://", "postgresql+psycopg://"), isolation_level="AUTOCOMMIT"
        )
        self.simulator = simulator_pids
        self.postmaster = postmaster
        self.start: dict[str, Any] = {}

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

    def begin(self) -> None:
        """The counters at a window's start (then `sample` each second, `end`: see `windows`)."""
        pg = self.backends()
        server = server_pids(self.postmaster)
        server_cpu = cpu_seconds(server)
        before, pg_cpu, sim_cpu = self._db(), cpu_seconds(pg), cpu_seconds(self.simulator)
        self.start = {"pg": pg, "server": server, "server_cpu": server_cpu, "before": before, "pg_cpu": pg_cpu}
        self.start.update({"sim_cpu": sim_cpu, "connections": [before["connections"]]})

    def sample(self) -> None:
        self.start["connections"].append(self._db()["connections"])

    def end(self, began: float, ended: float) -> dict[str, Any]:
        start, after = self.start, self._db()
        pg_used = cpu_seconds(start["pg"]) - start["pg_cpu"]  # connections are pooled: the same backends throughout
        server_used = cpu_seconds(start["server"]) - start["server_cpu"]
        sim_used = cpu_seconds(self.simulator) - start["sim_cpu"]
        before, wall = start["before"], ended - began
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
            "connections": max(start["connections"]),
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


def windows(meters: list[Meters], seconds: float) -> list[dict[str, Any]]:
    """Measure `seconds` of wall time from now on each database, one window for all (the shards of one fleet)."""
    for meter in meters:
        meter.begin()
    began = time.monotonic()
    while time.monotonic() - began < seconds:
        time.sleep(min(1.0, seconds - (time.monotonic() - began)))
        for meter in meters:
            meter.sample()
    ended = time.monotonic()
    return [meter.end(began, ended) for meter in meters]


def stage_figures(
    window: dict[str, Any],
    *,
    nodes: int,
    claims: list[tuple[float, float, float, int]],
    committed: list[tuple[float, int]],
    rate: float,
    step: float,
) -> dict[str, Any]:
    """One stage on one database (or a fleet's shards together): its meters' window, the results committed inside
    it against the nodes' demand, the claims asked inside it, and whether it is saturated."""
    began, ended = window["began"], window["ended"]
    inside = [c for c in claims if began <= c[0] < ended]
    stage: dict[str, Any] = {"nodes": nodes, **window}
    stage["results_per_s"] = round(sum(n for at, n in committed if began <= at < ended) / (ended - began), 1)
    stage["demand_per_s"] = round(nodes * rate, 1)
    stage["share_of_demand"] = round(stage["results_per_s"] / stage["demand_per_s"], 3) if nodes else 0.0
    stage["claims"] = len(inside)
    stage["claim_p50_ms"] = round(percentile([c[1] for c in inside], 50) * 1000, 1)
    stage["claim_p99_ms"] = round(percentile([c[1] for c in inside], 99) * 1000, 1)
    stage["claim_db_p99_ms"] = round(percentile([c[2] for c in inside], 99) * 1000, 1)
    stored = stage["results_per_s"] * (ended - began)
    stage["postgres_cpu_ms_per_result"] = round(stage["postgres_cpu_seconds"] * 1000 / stored, 3) if stored else None
    stage["saturated"] = stage["share_of_demand"] < 0.95 or stage["claim_p99_ms"] > step * 1000
    return stage
