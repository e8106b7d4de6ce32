"""A fleet of GPU nodes on one Postgres queue (issue 41 section 2): where does the database saturate?

One real Postgres; many virtual 8xH100 nodes (bench/fleet_nodes.py: the runner's claim / record / renew pattern
through the real storage code, an engine timed by the planner's formula for 70B FP8) multiplexed onto
`--procs` processes, each with `--pool` connections. The fleet is ramped stage by stage (`--nodes`); each stage
runs `--warmup` seconds for the new nodes to fill, then is measured for `--seconds`:

* results/s committed against the nodes' demand (nodes x one node's rate: its engine never left waiting);
* claim latency p50 / p99 (from a node asking to its rows, pool wait included) against one engine step;
* WAL MB/s (pg_current_wal_lsn, the whole server), transactions/s and rows written/s (this database);
* connections to the database; the CPU share of Postgres's processes and of the simulator's (of all cores).

A stage is saturated when results/s fall under 95% of the demand or p99 claim latency exceeds a step; the ramp
stops after a stage under 70%. After each workload: every claimed id claimed once (no double claim), every
stored row stored once, attempts = 1. Workloads: `long` (7-token prompts, 10-1,000 output tokens) and `short`
(500-token prompts, 1-10 output tokens). Usage:
    .venv/bin/python bench/fleet.py [--workloads long,short] [--nodes 25,50,100,200,400] [--quick]
`--shards S` runs the ramp on S queue databases, `--compare-shards S` each stage on one database then on S shards,
with the ratios (bench/fleet_shards.py: the next design of docs/scaling.md).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import sqlalchemy as sa

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._setup import OUT, fresh_postgres, plot_dir, submit
from bench.fleet_meters import Meters, stage_figures, windows
from bench.fleet_shards import (
    Clusters,
    Database,
    checkpoint,
    compare,
    process_count,
    shard_nodes,
    tenants_by_shard,
    total_window,
)

MODEL = "fleet-model"
ADD_PER_SECOND = 40  # nodes joining per second per process
TENANTS = tuple(f"tenant-{i}" for i in range(4))  # one database's (sharded: bench/fleet_shards.py tenants_by_shard)


def _process(
    url: str, workload: str, index: int, procs: int, pool: int, target: Any, stop: Any, ready: Any, out: Any
) -> None:
    os.environ["BACKFILL_DATABASE_URL"] = url
    from bench.fleet_nodes import TICK, Fleet, workloads
    from storage.db import transaction

    fleet = Fleet(workloads()[workload], pool=pool, process=index)
    with transaction() as session:  # imports done and a connection open before the ramp starts
        session.execute(sa.text("SELECT 1"))
    ready.set()
    added = time.monotonic()
    while not stop.is_set():
        # New nodes join at ADD_PER_SECOND per process, not all in one tick (their first claims are 768 rows).
        if len(fleet.nodes) * procs + index < target.value and time.monotonic() - added >= 1 / ADD_PER_SECOND:
            fleet.add_node(len(fleet.nodes) * procs + index)
            added = time.monotonic()
        began = time.monotonic()
        fleet.tick()
        time.sleep(max(0.0, TICK - (time.monotonic() - began)))
    fleet.stopping = True  # writes still queued are dropped: their rows stay running (counted at the end)
    fleet.claimer.shutdown(wait=True, cancel_futures=True)
    fleet.executor.shutdown(wait=True, cancel_futures=True)
    fleet.settle()
    out.put(
        {
            "claims": fleet.claims,
            "committed": fleet.committed,
            "claimed_ids": fleet.claimed_ids,
            "stored": len(fleet.stored_ids),
            "lost": fleet.lost,
            "errors": fleet.errors[:5],
            "error_count": len(fleet.errors),
            "index": index,
        }
    )


def populate(url: str, workload: str, rows: int, tenants: Sequence[str] = TENANTS) -> None:
    """The tenants' batches (100 requests each) through the real ingest, then cloned in SQL up to `rows` queued."""
    prompt = "word " * (500 if workload == "short" else 7)
    for n, tenant in enumerate(tenants):
        lines = (
            {
                "custom_id": f"t{n}-{i}",
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": {
                    "model": MODEL,
                    "messages": [{"role": "user", "content": f"{i} {prompt}"}],
                    "max_tokens": 1000,
                },
            }
            for i in range(100)
        )
        submit(lines, tenant=tenant, model=MODEL)
    engine = sa.create_engine(url.replace("postgresql://", "postgresql+psycopg://"))
    with engine.begin() as conn:
        columns = [
            c
            for (c,) in conn.execute(
                sa.text("SELECT column_name FROM information_schema.columns WHERE table_name = 'batch_requests'")
            )
        ]
        made = {"id": "t.id || '_' || g", "line": "t.line + g * 1000", "custom_id": "t.custom_id || '_' || g"}
        chosen = ", ".join(made.get(c, f"t.{c}") for c in columns)
        copies = max(1, rows // (100 * len(tenants)))
        conn.execute(
            sa.text(
                f"INSERT INTO batch_requests ({', '.join(columns)}) SELECT {chosen}"
                " FROM batch_requests t CROSS JOIN generate_series(1, :n) g"
            ),
            {"n": copies},
        )
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(sa.text("VACUUM ANALYZE"))
    engine.dispose()


def backlog_scan_seconds() -> float:
    """One sum of the urgency horizon's backlog (the model's open rows: storage/queue/backlog.py), which one process
    of the fleet repeats every HORIZON_MAX_AGE_SECONDS while the others read its row (storage/queue/fleet_backlog.py)."""
    from storage.db import transaction
    from storage.queue.backlog import drain_seconds
    from storage.settings import get_settings

    began = time.perf_counter()
    with transaction() as session:
        drain_seconds(session, model=MODEL, settings=get_settings())
    return time.perf_counter() - began


def prepare(database: Database, workload: str, rows: int, tenants: list[str]) -> float:
    """Point this process's storage at a fresh database, migrate it (Alembic) and fill it; one backlog sum's time."""
    os.environ["BACKFILL_DATABASE_URL"] = database.url
    from storage.db import get_engine, get_sessionmaker
    from storage.settings import get_settings
    from worker.cli.migrate import migrate_database

    for cached in (get_settings, get_engine, get_sessionmaker):  # a fresh database per workload (and per shard)
        cached.cache_clear()
    migrate_database()
    populate(database.url, workload, rows, tenants)
    if database.postmaster is not None:  # a shard's own cluster (bench/fleet_shards.py)
        checkpoint(database.url)
    return backlog_scan_seconds()


def run(workload: str, args: argparse.Namespace, databases: list[Database], tenants: list[list[str]]) -> dict[str, Any]:
    """One ramp of the fleet on one database, or on S shards (`databases`, each filled with its `tenants`' batches)."""
    from bench.fleet_nodes import workloads

    shape, shards = workloads()[workload], len(databases)
    scans = [prepare(db, workload, args.rows // shards, names) for db, names in zip(databases, tenants, strict=True)]
    ctx = mp.get_context("spawn")
    target, stop, out = ctx.Value("i", 0), ctx.Event(), ctx.Queue()
    count = process_count(args.procs, shards)  # process i serves shard i % S
    ready = [ctx.Event() for _ in range(count)]
    procs = [
        ctx.Process(
            target=_process,
            args=(databases[i % shards].url, workload, i, count, args.pool, target, stop, ready[i], out),
        )
        for i in range(count)
    ]
    for proc in procs:
        proc.start()
    for event in ready:
        event.wait(120)
    meters = [
        Meters(db.url, [p.pid for i, p in enumerate(procs) if i % shards == s and p.pid], db.postmaster)
        for s, db in enumerate(databases)
    ]
    measured: list[tuple[int, list[dict[str, Any]]]] = []
    try:
        for nodes in [int(n) for n in args.nodes.split(",")]:
            target.value = nodes
            time.sleep(args.warmup)
            each = windows(meters, args.seconds)
            measured.append((nodes, each))
            window = each[0] if shards == 1 else total_window(each)
            print(json.dumps({"workload": workload, "shards": shards, "nodes": nodes, **window}), flush=True)
            # the next stage's nodes claim 768 rows each
            if any(w["db_queued"] < shard_nodes(nodes, s, shards) * 800 for s, w in enumerate(each)):
                print("queue nearly dry: stopping the ramp", flush=True)
                break
    finally:
        stop.set()
        outs = [out.get(timeout=300) for _ in procs]
        for proc in procs:
            proc.join(timeout=60)
    rate, step = shape.node_rate(), shape.step_seconds
    by_shard = [[o for o in outs if o["index"] % shards == s] for s in range(shards)]

    def figures(window: dict[str, Any], nodes: int, part: list[dict[str, Any]]) -> dict[str, Any]:
        claims, committed = [c for o in part for c in o["claims"]], [c for o in part for c in o["committed"]]
        return stage_figures(window, nodes=nodes, claims=claims, committed=committed, rate=rate, step=step)

    stages = []
    for nodes, each in measured:
        per = [figures(w, shard_nodes(nodes, s, shards), by_shard[s]) for s, w in enumerate(each)]
        stages.append(per[0] if shards == 1 else {**figures(total_window(each), nodes, outs), "shards": per})
    checks = []
    for part, meter in zip(by_shard, meters, strict=True):  # exactly once, on every shard
        ids = [i for o in part for i in o["claimed_ids"]]
        stored = sum(o["stored"] for o in part)
        checks.append({"double_claims": len(ids) - len(set(ids)), "claimed": len(ids), "stored": stored})
        checks[-1].update(meter.final_checks())
    reached = max([s["nodes"] for s in stages if not s["saturated"]], default=0)
    result = {
        "workload": workload,
        "step_ms": round(step * 1000, 2),
        "node_rate_per_s": round(rate, 2),
        "stages": stages,
        "nodes_reached": reached,
        "backlog_scan_ms": round(max(scans) * 1000, 1),
        "queued_at_start": args.rows,
        **{k: sum(c[k] for c in checks) for k in ("double_claims", "claimed", "stored")},
        "lost_leases": sum(o["lost"] for o in outs),
        "errors": [e for o in outs for e in o["errors"]],
        "error_count": sum(o["error_count"] for o in outs),
        **{k: sum(c[k] for c in checks) for k in ("attempts_over_1", "completed", "running_at_stop")},
    }
    if shards > 1:
        result.update({"shards": shards, "processes": count, "tenants": tenants, "per_shard": checks})
    return result


def plot(results: list[dict[str, Any]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(11, 7.5))
    for result in results:
        nodes = [s["nodes"] for s in result["stages"]]
        label = f"{result['workload']} outputs"
        axes[0][0].plot(nodes, [s["results_per_s"] for s in result["stages"]], "o-", label=f"{label}: stored")
        axes[0][0].plot(nodes, [s["demand_per_s"] for s in result["stages"]], ":", label=f"{label}: demand")
        claimed = [s for s in result["stages"] if s["claims"]]  # a stage with no claim has no latency to show
        axes[0][1].plot(
            [s["nodes"] for s in claimed], [s["claim_p99_ms"] for s in claimed], "o-", label=f"{label}: p99"
        )
        axes[0][1].axhline(result["step_ms"], linestyle=":", color="grey")
        axes[1][0].plot(nodes, [s["wal_mb_per_s"] for s in result["stages"]], "o-", label=label)
        axes[1][1].plot(nodes, [s["postgres_cpu_share"] for s in result["stages"]], "o-", label=f"{label}: Postgres")
        axes[1][1].plot(nodes, [s["simulator_cpu_share"] for s in result["stages"]], "x--", label=f"{label}: simulator")
    titles = ("results/s vs nodes", "claim latency p99 (ms; dotted: one step)", "WAL MB/s", "CPU share of all cores")
    for ax, title in zip([a for row in axes for a in row], titles, strict=True):
        ax.set_title(title)
        ax.set_xscale("log")
        ax.set_xlabel("nodes (8xH100, 70B FP8)")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(plot_dir() / "fleet.png", dpi=110)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workloads", default="long,short")
    parser.add_argument("--nodes", default="")
    parser.add_argument("--procs", type=int, default=2)
    parser.add_argument(
        "--pool", type=int, default=4, help="threads (connections) per process for claims, and for writes"
    )
    parser.add_argument("--warmup", type=float, default=6.0)
    parser.add_argument("--seconds", type=float, default=12.0)
    parser.add_argument("--rows", type=int, default=400_000)
    parser.add_argument("--quick", action="store_true", help="two small stages per workload (~1 min)")
    parser.add_argument("--shards", type=int, default=1, help="S queue databases, a Postgres cluster each")
    parser.add_argument(
        "--compare-shards", type=int, default=0, metavar="S", help="each stage on one database, then on S shards"
    )
    args = parser.parse_args()
    os.environ["BACKFILL_MODELS"] = json.dumps({MODEL: {"path": "fake:", "max_num_seqs": 384}})
    os.environ["BACKFILL_DATA_DIR"] = str(OUT / "fleet-data")
    if args.quick:
        args.warmup, args.seconds, args.rows = 4.0, 6.0, 40_000
    OUT.mkdir(exist_ok=True)
    if args.compare_shards:
        compared = compare(args, run)
        info = {"shards": args.compare_shards, "processes": process_count(args.procs, args.compare_shards)}
        (OUT / "fleet-shards.json").write_text(
            json.dumps({"workloads": compared, "cores": os.cpu_count(), **info}, indent=2)
        )
        return 0
    results = []
    clusters = Clusters(args.shards) if args.shards > 1 else None
    try:
        for workload in args.workloads.split(","):
            default = {"long": "10,25,50,100,200,400", "short": "5,10,25,50,100,200"}[workload]
            nodes = args.nodes or ("5,10" if args.quick else default)
            ramp = argparse.Namespace(**{**vars(args), "nodes": nodes})
            if clusters is None:
                url = fresh_postgres("backfill_fleet")
                assert url, "no Postgres"
                results.append(run(workload, ramp, [Database(url)], tenants_by_shard(1)))
                continue
            with clusters.databases(f"fleet_{workload}", args.shards) as databases:
                results.append(run(workload, ramp, databases, tenants_by_shard(args.shards)))
    finally:
        if clusters is not None:
            clusters.stop()
    print(json.dumps(results, indent=2))
    name = "fleet.json" if clusters is None else f"fleet-{args.shards}-shards.json"
    (OUT / name).write_text(json.dumps({"workloads": results, "cores": os.cpu_count()}, indent=2))
    if clusters is None:
        plot(results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
