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
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import sys
import time
from pathlib import Path
from typing import Any

import sqlalchemy as sa

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._setup import OUT, fresh_postgres, plot_dir, submit
from bench.fleet_meters import Meters, percentile

MODEL = "fleet-model"
ADD_PER_SECOND = 40  # nodes joining per second per process


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
        }
    )


def populate(url: str, workload: str, rows: int) -> None:
    """4 tenants' batches through the real ingest, then cloned in SQL up to `rows` queued requests."""
    prompt = "word " * (500 if workload == "short" else 7)
    for tenant in range(4):
        lines = (
            {
                "custom_id": f"t{tenant}-{i}",
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
        submit(lines, tenant=f"tenant-{tenant}", model=MODEL)
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
        copies = max(1, rows // 400)
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


def run(workload: str, args: argparse.Namespace) -> dict[str, Any]:
    from bench.fleet_nodes import workloads

    shape = workloads()[workload]
    url = fresh_postgres("backfill_fleet")
    assert url, "no Postgres"
    os.environ["BACKFILL_DATABASE_URL"] = url
    from storage.db import get_engine, get_sessionmaker
    from storage.settings import get_settings
    from worker.cli.migrate import migrate_database

    for cached in (get_settings, get_engine, get_sessionmaker):  # a fresh database per workload
        cached.cache_clear()
    migrate_database()
    populate(url, workload, args.rows)
    scan = backlog_scan_seconds()
    ctx = mp.get_context("spawn")
    target, stop, out = ctx.Value("i", 0), ctx.Event(), ctx.Queue()
    ready = [ctx.Event() for _ in range(args.procs)]
    procs = [
        ctx.Process(target=_process, args=(url, workload, i, args.procs, args.pool, target, stop, ready[i], out))
        for i in range(args.procs)
    ]
    for proc in procs:
        proc.start()
    for event in ready:
        event.wait(120)
    meters = Meters(url, [proc.pid for proc in procs if proc.pid])
    stages: list[dict[str, Any]] = []
    try:
        for nodes in [int(n) for n in args.nodes.split(",")]:
            target.value = nodes
            time.sleep(args.warmup)
            window = meters.window(args.seconds)
            stages.append({"nodes": nodes, **window})
            print(json.dumps({"workload": workload, "nodes": nodes, **window}), flush=True)
            if window["db_queued"] < nodes * 800:  # the next stage's nodes claim 768 rows each
                print("queue nearly dry: stopping the ramp", flush=True)
                break
    finally:
        stop.set()
        outs = [out.get(timeout=300) for _ in procs]
        for proc in procs:
            proc.join(timeout=60)
    rate, step = shape.node_rate(), shape.step_seconds
    claims = [c for o in outs for c in o["claims"]]
    committed = [c for o in outs for c in o["committed"]]
    for stage in stages:
        began, ended = stage["began"], stage["ended"]
        inside = [c for c in claims if began <= c[0] < ended]
        stage["results_per_s"] = round(sum(n for at, n in committed if began <= at < ended) / (ended - began), 1)
        stage["demand_per_s"] = round(stage["nodes"] * rate, 1)
        stage["share_of_demand"] = round(stage["results_per_s"] / stage["demand_per_s"], 3)
        stage["claims"] = len(inside)
        stage["claim_p50_ms"] = round(percentile([c[1] for c in inside], 50) * 1000, 1)
        stage["claim_p99_ms"] = round(percentile([c[1] for c in inside], 99) * 1000, 1)
        stage["claim_db_p99_ms"] = round(percentile([c[2] for c in inside], 99) * 1000, 1)
        stored = stage["results_per_s"] * (ended - began)
        stage["postgres_cpu_ms_per_result"] = (
            round(stage["postgres_cpu_seconds"] * 1000 / stored, 3) if stored else None
        )
        stage["saturated"] = stage["share_of_demand"] < 0.95 or stage["claim_p99_ms"] > step * 1000
    ids = [i for o in outs for i in o["claimed_ids"]]
    checks = meters.final_checks()
    reached = max([s["nodes"] for s in stages if not s["saturated"]], default=0)
    return {
        "workload": workload,
        "step_ms": round(step * 1000, 2),
        "node_rate_per_s": round(rate, 2),
        "stages": stages,
        "nodes_reached": reached,
        "backlog_scan_ms": round(scan * 1000, 1),
        "queued_at_start": args.rows,
        "double_claims": len(ids) - len(set(ids)),
        "claimed": len(ids),
        "stored": sum(o["stored"] for o in outs),
        "lost_leases": sum(o["lost"] for o in outs),
        "errors": [e for o in outs for e in o["errors"]],
        "error_count": sum(o["error_count"] for o in outs),
        **checks,
    }


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
    args = parser.parse_args()
    os.environ["BACKFILL_MODELS"] = json.dumps({MODEL: {"path": "fake:", "max_num_seqs": 384}})
    os.environ["BACKFILL_DATA_DIR"] = str(OUT / "fleet-data")
    if args.quick:
        args.warmup, args.seconds, args.rows = 4.0, 6.0, 40_000
    results = []
    for workload in args.workloads.split(","):
        default = {"long": "10,25,50,100,200,400", "short": "5,10,25,50,100,200"}[workload]
        nodes = args.nodes or ("5,10" if args.quick else default)
        results.append(run(workload, argparse.Namespace(**{**vars(args), "nodes": nodes})))
    print(json.dumps(results, indent=2))
    OUT.mkdir(exist_ok=True)
    (OUT / "fleet.json").write_text(json.dumps({"workloads": results, "cores": os.cpu_count()}, indent=2))
    plot(results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
