"""bench/fleet.py on S queue databases: the next design of docs/scaling.md (queues partitioned into shards), measured.

A shard is a Postgres cluster of its own (tests/chaos/services.py's `Postgres`, the chaos harness's private cluster,
here durable as the machine's server: fsync and full-page writes on), so each shard has its own WAL, WAL insert lock,
shared buffers, hot pages and counters rows, as separate servers would (the disk and the 2 cores stay shared). Each
shard's database is migrated with the project's Alembic migrations and holds whole batches: a tenant's batches go to
the shard its name hashes to (`shard_of`), and the bench picks the tenants so that every shard holds as many
(`tenants_by_shard`): the comparison measures the databases, not an imbalance. The virtual nodes are split evenly:
node n runs on process n % P, and process p serves shard p % S only (P a multiple of S), so each node claims,
records and renews on its shard alone, through the same functions as with one database.

Exactly-once is per shard (a request is one row of one shard): bench/fleet.py checks every shard's rows at the end.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

TENANTS = 4  # tenants of the fleet's queue (bench/fleet.py's populate), shared out across the shards
Ramp = Callable[[str, argparse.Namespace, list["Database"], list[list[str]]], dict[str, Any]]
SUMMED = (
    "wal_mb_per_s",
    "transactions_per_s",
    "rows_written_per_s",
    "connections",
    "postgres_cpu_share",
    "postgres_cpu_seconds",
    "server_cpu_share",
    "simulator_cpu_share",
    "db_queued",
)


def shard_of(tenant: str, shards: int) -> int:
    """The shard that holds a tenant's batches: a stable hash of its name (not Python's hash(), salted per process)."""
    return int.from_bytes(hashlib.sha256(tenant.encode()).digest()[:8], "big") % shards


def tenants_by_shard(shards: int, total: int = TENANTS) -> list[list[str]]:
    """Per shard, the first names tenant-0, tenant-1, ... that hash to it, as many on each (at least `total` in all):
    with one shard, tenant-0 to tenant-3 (bench/fleet.py's four tenants)."""
    per_shard = -(-total // shards)
    found: list[list[str]] = [[] for _ in range(shards)]
    index = 0
    while any(len(names) < per_shard for names in found):
        name = f"tenant-{index}"
        shard = shard_of(name, shards)
        if len(found[shard]) < per_shard:
            found[shard].append(name)
        index += 1
    return found


def process_count(procs: int, shards: int) -> int:
    """Simulator processes for S shards: `procs` rounded down to a multiple of S, one per shard at least."""
    return shards * max(1, procs // shards)


def shard_nodes(nodes: int, shard: int, shards: int) -> int:
    """How many of a fleet's `nodes` run on `shard` (node n on shard n % S: process n % P serves shard p % S)."""
    return nodes // shards + (1 if shard < nodes % shards else 0)


def total_window(windows: list[dict[str, Any]]) -> dict[str, Any]:
    """The shards' meters over one window, added up: WAL, transactions, rows, connections, CPU, rows still queued."""
    total: dict[str, Any] = {"began": windows[0]["began"], "ended": windows[0]["ended"]}
    for key in SUMMED:
        total[key] = round(sum(w[key] for w in windows), 3)
    total["load_average"] = windows[0]["load_average"]
    return total


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    """numerator / denominator to 3 decimals; None where either is missing or the denominator is 0."""
    if numerator is None or not denominator:
        return None
    return round(numerator / denominator, 3)


def compare_stages(one: list[dict[str, Any]], sharded: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """For each node count measured on both: S shards against one database (results/s, fed share, p99 claim, CPU)."""
    by_nodes = {stage["nodes"]: stage for stage in one}
    rows = []
    for stage in sharded:
        base = by_nodes.get(stage["nodes"])
        if base is None:
            continue
        rows.append(
            {
                "nodes": stage["nodes"],
                "demand_per_s": stage["demand_per_s"],
                "results_per_s_one": base["results_per_s"],
                "results_per_s_sharded": stage["results_per_s"],
                "results_per_s_ratio": ratio(stage["results_per_s"], base["results_per_s"]),
                "fed_share_one": base["share_of_demand"],
                "fed_share_sharded": stage["share_of_demand"],
                "fed_shares_per_shard": [s["share_of_demand"] for s in stage.get("shards", [stage])],
                "claim_p99_ms_one": base["claim_p99_ms"],
                "claim_p99_ms_sharded": stage["claim_p99_ms"],
                "claim_p99_ratio": ratio(stage["claim_p99_ms"], base["claim_p99_ms"]),
                "server_cpu_share_one": base["server_cpu_share"],
                "server_cpu_share_sharded": stage["server_cpu_share"],
                "wal_mb_per_s_one": base["wal_mb_per_s"],
                "wal_mb_per_s_sharded": stage["wal_mb_per_s"],
            }
        )
    return rows


def compare(args: argparse.Namespace, run: Ramp) -> list[dict[str, Any]]:
    """Each workload's stages on one database, then on S shards (private clusters both, the same processes and
    connections in all, the same tenants' batches), and the ratios at each node count. `run` is bench/fleet.py's."""
    shards = args.compare_shards
    tenants = tenants_by_shard(shards)
    ramp = {**vars(args), "procs": process_count(args.procs, shards)}
    results = []
    clusters = Clusters(shards)
    try:
        for workload in args.workloads.split(","):
            ns = argparse.Namespace(**{**ramp, "nodes": args.nodes or ("4" if args.quick else "50,100")})
            with clusters.databases(f"fleet_{workload}_one", 1) as databases:
                one = run(workload, ns, databases, [[t for names in tenants for t in names]])
            with clusters.databases(f"fleet_{workload}_shards", shards) as databases:
                sharded = run(workload, ns, databases, tenants)
            ratios = compare_stages(one["stages"], sharded["stages"])
            for row in ratios:
                print(json.dumps({"workload": workload, "shards": shards, **row}), flush=True)
            results.append({"workload": workload, "one": one, "sharded": sharded, "ratios": ratios})
    finally:
        clusters.stop()
    return results


@dataclass(frozen=True)
class Database:
    """One shard's database: its URL, and its server's postmaster (None: the machine's shared server)."""

    url: str
    postmaster: int | None = None


class Clusters:
    """S private Postgres clusters on free ports (the chaos harness's `Postgres`), kept for a whole run; each ramp
    gets a fresh database on the first `count` of them, dropped after it."""

    def __init__(self, count: int) -> None:
        from tests.chaos.services import Postgres

        self.root = Path(tempfile.mkdtemp(prefix="backfill-fleet-shards-"))
        self.servers = [Postgres(self.root / f"shard-{i}", durable=True) for i in range(count)]
        try:
            for server in self.servers:
                server.init()
                server.start()
        except BaseException:
            self.stop()
            raise

    @contextmanager
    def databases(self, name: str, count: int) -> Iterator[list[Database]]:
        """A fresh database `name` on each of the first `count` clusters, dropped (connections and all) after."""
        servers = self.servers[:count]
        for server in servers:
            server.admin(f'CREATE DATABASE "{name}"')
        try:
            yield [Database(s.url(name), s.child.popen.pid if s.child.popen else None) for s in servers]
        finally:
            for server in servers:
                server.admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def stop(self) -> None:
        for server in self.servers:
            server.remove()
        shutil.rmtree(self.root, ignore_errors=True)


def checkpoint(url: str) -> None:
    """A checkpoint after the fill, so no shard's first stage pays for the fill's dirty pages and WAL."""
    import sqlalchemy as sa

    engine = sa.create_engine(url.replace("postgresql://", "postgresql+psycopg://"), isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        conn.execute(sa.text("CHECKPOINT"))
    engine.dispose()
