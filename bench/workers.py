"""N GPU workers on one Postgres queue (issue 15 section 2): does adding a worker add throughput?

Each worker is its own process with its own worker id, running the real runner (claim, step, record,
lease renewal, reconcile) and the real liveness heartbeat on the fake engine, whose step takes a fixed
`--step-ms` (so 2 cores can host 8 "GPUs": the engine time is a sleep, the runner's and Postgres's work is
real). For 1, 2, 4 and 8 workers, 4 tenants each queue one equal batch sized so the run lasts about
`--seconds`; the clock starts once every worker is warm. Reported per run: requests/s and the ratio to one
worker, double claims (ids handed to two engines), attempts (all 1), the fair share across tenants when half
the work is done (least ÷ most completed), and each worker's engine busy share (time in `step` ÷ wall).
Then one more run with `--kill-workers` workers kills one with SIGKILL a third of the way in: the parent
runs the reaper every second, which releases the dead worker's leases once its heartbeat is stale
(`BACKFILL_WORKER_STALE_SECONDS`, 3 s here), and the others finish its work; the batches are finalized
and every custom_id must appear exactly once in the output files. Usage:
    .venv/bin/python bench/workers.py [--workers 1,2,4,8] [--seconds 10] [--quick]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import signal
import sys
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import sqlalchemy as sa

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._setup import OUT, PG_ADMIN, plot_dir, result_lines, submit

MODEL = "fake-model"
TENANTS = 4


def _worker(index: int, run: str, args: dict[str, Any], ready: Any, go: Any, stop: Any, results: Any) -> None:
    """One GPU worker process: the runner on a fixed-step fake engine, beating, until told to stop."""
    from storage.queue.workers import WorkerIdentity
    from storage.settings import get_settings
    from worker.engine import EngineRequest, EngineResult
    from worker.engine.fake import FakeEngine
    from worker.feed.runner import Runner
    from worker.process.liveness import Heartbeat, make_identity

    class TimedSteps(FakeEngine):
        """The fake engine, counting time in `step` and every id it was handed."""

        def __init__(self) -> None:
            super().__init__(MODEL, max_num_seqs=args["max_num_seqs"], max_model_len=4096, step_seconds=args["step_s"])
            self.busy = 0.0
            self.added: list[str] = []

        def add(self, request: EngineRequest) -> EngineResult | None:
            self.added.append(request.request_id)
            return super().add(request)

        def step(self) -> list[EngineResult]:
            started = time.perf_counter()
            try:
                return super().step()
            finally:
                self.busy += time.perf_counter() - started

    settings = get_settings()
    engine = TimedSteps()
    me = make_identity(settings)
    identity = WorkerIdentity(f"{run}-w{index}-{me.worker_id}", me.host, me.pid)
    runner = Runner(engine, model=MODEL, settings=settings, worker_id=identity.worker_id)
    spent = _profile(runner, ("_top_up", "_flush", "_reconcile"))
    heartbeat = Heartbeat(identity, settings, models=[MODEL], runners=lambda: [runner])
    heartbeat.start()
    ready.put(index)
    go.wait()
    began, cpu = time.perf_counter(), time.process_time()
    while not stop.is_set():
        if not runner.run_for(1.0, stop=stop):
            time.sleep(0.02)
    wall, cpu = time.perf_counter() - began, time.process_time() - cpu
    heartbeat.shutdown()
    results.put({"index": index, "added": engine.added, "busy": engine.busy, "wall": wall, "cpu": cpu, "spent": spent})


def _profile(runner: Any, names: tuple[str, ...]) -> dict[str, float]:
    """Wall seconds spent in each of the runner's database steps (claim, record, lease renewal)."""
    spent = dict.fromkeys(names, 0.0)
    for name in names:
        method = getattr(runner, name)

        def timed(*a: Any, _name: str = name, _method: Any = method, **k: Any) -> Any:
            started = time.perf_counter()
            try:
                return _method(*a, **k)
            finally:
                spent[_name] += time.perf_counter() - started

        setattr(runner, name, timed)
    return spent


def populate(*, per_tenant: int, max_tokens: int, label: str) -> list[str]:
    """One batch per tenant, equal in size."""
    batch_ids = []
    for tenant in range(TENANTS):
        lines = (
            {
                "custom_id": f"{label}-t{tenant}-{i}",
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": {"model": MODEL, "messages": [{"role": "user", "content": f"{i}"}], "max_tokens": max_tokens},
            }
            for i in range(per_tenant)
        )
        batch_ids.append(submit(lines, tenant=f"tenant-{tenant}", model=MODEL))
    return batch_ids


def progress(engine: sa.Engine, batch_ids: list[str]) -> dict[str, int]:
    """Completed requests per tenant of these batches."""
    query = sa.text(
        "SELECT tenant_id, count(*) FROM batch_requests WHERE batch_id = ANY(:ids) AND status = 'completed'"
        " GROUP BY tenant_id"
    )
    with engine.connect() as conn:
        return {tenant: int(n) for tenant, n in conn.execute(query, {"ids": batch_ids})}


def waiting_on_locks(engine: sa.Engine) -> int:
    """Database sessions of this run waiting for a row or relation lock right now (the profile's lock side)."""
    query = sa.text(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
    )
    with engine.connect() as conn:
        return int(conn.scalar(query) or 0)


def reap_once() -> int:
    from storage.db import transaction
    from worker.jobs.reaper import reap

    with transaction() as session:
        return reap(session).requeued


def run(engine: sa.Engine, *, workers: int, args: argparse.Namespace, kill_at: float | None = None) -> dict[str, Any]:
    """One measured run: queue the work, start `workers` warm processes, time them to the last result."""
    per_worker = args.max_num_seqs / (args.max_tokens * args.step_ms / 1000)  # requests/s at a busy share of 1
    per_tenant = max(50, int(per_worker * workers * args.seconds / TENANTS))
    label = f"n{workers}{'k' if kill_at else ''}"
    batch_ids = populate(per_tenant=per_tenant, max_tokens=args.max_tokens, label=label)
    total = per_tenant * TENANTS
    ctx = mp.get_context("spawn")
    ready, results, go, stop = ctx.Queue(), ctx.Queue(), ctx.Event(), ctx.Event()
    spec = {"max_num_seqs": args.max_num_seqs, "step_s": args.step_ms / 1000}
    procs = [
        ctx.Process(target=_worker, args=(i, label, spec, ready, go, stop, results), daemon=True)
        for i in range(workers)
    ]
    for proc in procs:
        proc.start()
    for _ in procs:
        ready.get(timeout=120)
    go.set()
    began = time.perf_counter()
    half: dict[str, int] | None = None
    killed_at = None
    last_reap = 0.0
    lock_waits: list[int] = []
    while True:
        done = progress(engine, batch_ids)
        lock_waits.append(waiting_on_locks(engine))
        completed = sum(done.values())
        if half is None and completed >= total / 2:
            half = done
        if kill_at is not None and killed_at is None and completed >= total * kill_at:
            os.kill(procs[-1].pid or 0, signal.SIGKILL)  # kill -9: no hand-back, no goodbye
            killed_at = time.perf_counter() - began
        if completed >= total:
            break
        if time.perf_counter() - last_reap >= 1.0:  # beat's lease.reap, every second
            last_reap = time.perf_counter()
            reap_once()
        if time.perf_counter() - began > args.seconds * 20 + 60:
            raise RuntimeError(f"{label}: only {completed}/{total} done")
        time.sleep(0.2)  # the poll itself costs a core share on a small machine
    seconds = time.perf_counter() - began
    stop.set()
    alive = workers - (1 if kill_at is not None else 0)
    outs = [results.get(timeout=60) for _ in range(alive)]
    for proc in procs:
        proc.join(10)
    claims = Counter(rid for out in outs for rid in set(out["added"]))
    with engine.connect() as conn:
        attempts = dict(
            conn.execute(
                sa.text("SELECT attempts, count(*) FROM batch_requests WHERE batch_id = ANY(:ids) GROUP BY attempts"),
                {"ids": batch_ids},
            ).all()
        )
    shares = list((half or {}).values())
    walls = sum(o["wall"] for o in outs)
    where = {name: round(sum(o["spent"][name] for o in outs) / walls, 3) for name in outs[0]["spent"]}
    result = {
        "workers": workers,
        "requests": total,
        "seconds": round(seconds, 2),
        "requests_per_s": round(total / seconds, 1),
        "ideal_requests_per_s": round(per_worker * workers, 1),
        "double_claims": sum(n - 1 for n in claims.values()),
        "attempts": {str(k): int(v) for k, v in sorted(attempts.items())},
        "fair_share_min_over_max": round(min(shares) / max(shares), 3) if len(shares) == TENANTS else 0.0,
        "engine_busy_share": round(sum(o["busy"] for o in outs) / sum(o["wall"] for o in outs), 3),
        "runner_cpu_ms_per_request": round(1000 * sum(o["cpu"] for o in outs) / total, 3),
        # Share of each worker's wall time in the runner's database steps (the rest of what is not busy is
        # waiting for a core: the load average says how many runnable processes shared this machine's).
        "wall_share": {"claim": where["_top_up"], "record": where["_flush"], "renew": where["_reconcile"]},
        "load_average_1m": round(os.getloadavg()[0], 2),
        "sessions_waiting_on_locks_mean": round(sum(lock_waits) / max(1, len(lock_waits)), 2),
        "claims_per_worker": [len(set(o["added"])) for o in sorted(outs, key=lambda o: o["index"])],
    }
    if kill_at is not None:
        result |= {"killed_at_s": round(killed_at or 0.0, 2), **exactly_once(engine, batch_ids, total)}
    print(json.dumps(result), flush=True)
    return result


def exactly_once(engine: sa.Engine, batch_ids: list[str], total: int) -> dict[str, Any]:
    """Finalize the batches and count each custom_id across their output and error files."""
    seen = Counter(line["custom_id"] for line in result_lines(engine, batch_ids))
    return {
        "result_lines": sum(seen.values()),
        "every_custom_id_once": len(seen) == total and set(seen.values()) == {1},
    }


def plot_throughput(result: dict[str, Any]) -> None:
    """Throughput of N workers ÷ one worker against N, beside the ideal: docs/workers-throughput.png."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    counts = [r["workers"] for r in result["runs"]]
    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    ax.plot(counts, counts, "--", color="grey", label="ideal (N x one worker)")
    ax.plot(counts, [r["ratio_vs_one"] for r in result["runs"]], "o-", label="measured")
    for r in result["runs"]:
        ax.annotate(
            f"{r['ratio_vs_one']:.2f}x", (r["workers"], r["ratio_vs_one"]), textcoords="offset points", xytext=(6, -12)
        )
    ax.set_xlabel("GPU-worker processes on one Postgres queue")
    ax.set_ylabel("throughput / one worker")
    ax.set_xticks(counts)
    ax.set_title(f"N workers, fake engine ({result['step_ms']:.0f} ms steps), 2-core machine", fontsize=9)
    ax.legend()
    fig.tight_layout()
    fig.savefig(plot_dir() / "workers-throughput.png", dpi=110)
    plt.close(fig)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workers", default="1,2,4,8")
    parser.add_argument("--seconds", type=float, default=15.0, help="about how long each run lasts")
    parser.add_argument("--step-ms", type=float, default=50.0, help="the fake engine's fixed step time")
    parser.add_argument("--max-num-seqs", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--kill-workers", type=int, default=4)
    parser.add_argument("--quick", action="store_true", help="short runs (about 4 s each)")
    args = parser.parse_args()
    if args.quick:
        args.seconds = min(args.seconds, 4.0)
    dbname = f"backfill_workers_{uuid.uuid4().hex[:8]}"
    admin = sa.create_engine(PG_ADMIN, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(sa.text(f'CREATE DATABASE "{dbname}"'))
    url = f"postgresql+psycopg://postgres@127.0.0.1:5432/{dbname}"
    os.environ.update(
        {
            "BACKFILL_DATABASE_URL": url,
            "BACKFILL_DATA_DIR": str(OUT / f"workers-{dbname}"),
            "BACKFILL_MODELS": json.dumps({MODEL: {"path": "fake:", "max_num_seqs": args.max_num_seqs}}),
            "BACKFILL_HEARTBEAT_SECONDS": "1",
            "BACKFILL_WORKER_STALE_SECONDS": "3",
            "BACKFILL_ADMISSION_POLICY": "off",
        }
    )
    engine = sa.create_engine(url)
    try:
        from worker.cli.migrate import migrate_database

        migrate_database()
        runs = [run(engine, workers=int(n), args=args) for n in args.workers.split(",")]
        killed = run(engine, workers=args.kill_workers, args=args, kill_at=1 / 3)
        base = runs[0]["requests_per_s"]
        for r in runs:
            r["ratio_vs_one"] = round(r["requests_per_s"] / base, 2)
        result = {
            "step_ms": args.step_ms,
            "max_num_seqs": args.max_num_seqs,
            "max_tokens": args.max_tokens,
            "runs": runs,
            "ratios": {str(r["workers"]): r["ratio_vs_one"] for r in runs},
            "double_claims": sum(r["double_claims"] for r in runs) + killed["double_claims"],
            "fair_share_min_over_max": min(r["fair_share_min_over_max"] for r in runs),
            "kill": killed,
        }
        print(json.dumps(result, indent=2))
        OUT.mkdir(exist_ok=True)
        (OUT / "workers.json").write_text(json.dumps(result))
        plot_throughput(result)
    finally:
        engine.dispose()
        from storage.db import get_engine

        get_engine().dispose()
        with admin.connect() as conn:
            conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)'))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
