"""A rolling restart of 4 GPU-timed workers mid-batch (issue 21 item 8): how much decode work is thrown away?

Four worker processes (as bench/workers.py starts them: the real runner and heartbeat, each its own worker
id) run the GPU-timed fake (worker/engine/timed_fake.py, 70B FP8 on 8x H100 step times) on one Postgres
queue, each holding `--slots` long generations. Once every worker serves, they are restarted one at a time:

  graceful  SIGTERM, which a worker answers as production does (worker/process/shutdown.py `hand_back` with
            `shutdown_drain_budget`: a short drain, then every in-flight request re-queued with its
            generated token ids); wait for it to exit, start a new one, wait until it serves, next. Half-way,
            one batch is paused for a few seconds and resumed (its running requests handed back too).
  kill      the control: the same with kill -9, so only periodic checkpoints save anything; the new worker
            takes its predecessor's leases back at start (same host, dead pid).

Then each run goes to the end of the queue. Every engine keeps a decode ledger (worker/engine/decode_ledger.py),
so the figures survive the kills: decoded tokens (all processes, resumed prefixes not counted), delivered
completion tokens (the output lines' usage), resumed, discarded = decoded - delivered, and the share
(goal <= 0.01 for the graceful run). Lost and duplicated custom_ids are counted in the output files (goal 0).
The kill run is held to the stated checkpoint bound: a killed request loses fewer than
`checkpoint_every_tokens` plus what it decodes in one checkpoint interval, rounded up to the 2 s lease renewal
that checks it, plus 1 s for the write (docs/workers.md).

Usage: .venv/bin/python bench/rolling_restart.py [--quick] [--slots 384] [--requests 3072] [--modes term,kill]
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing as mp
import os
import signal
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._setup import OUT, result_lines
from bench.gpu_timed import MODEL, enqueue, prepare

WORKERS = 4


def _worker(index: int, events: Any) -> None:
    """One GPU worker: runner + heartbeat on the GPU-timed fake; on SIGTERM, the production hand-back."""
    import threading

    from storage.settings import get_settings
    from worker.engine.factory import load_engine
    from worker.feed.runner import Runner
    from worker.process import shutdown
    from worker.process.liveness import Heartbeat, make_identity

    signalled: list[float] = []
    stop = threading.Event()

    def on_term(_signum: int, _frame: object) -> None:
        signalled.append(time.monotonic())
        stop.set()

    signal.signal(signal.SIGTERM, on_term)
    settings = get_settings()
    identity = make_identity(settings)
    runner = Runner(load_engine(settings, MODEL), model=MODEL, settings=settings, worker_id=identity.worker_id)
    heartbeat = Heartbeat(identity, settings, models=[MODEL], runners=lambda: [runner])
    heartbeat.start()  # takes over the leases of a killed predecessor on this host
    serving = False
    while not stop.is_set():
        more = runner.run_for(1.0, stop=stop)
        if not serving:  # its first claims are in its engine (or the queue had nothing left for it)
            serving = True
            events.put(("serving", index, os.getpid(), len(runner.inflight)))
        if not more:
            stop.wait(0.05)
    elapsed = time.monotonic() - signalled[0] if signalled else 0.0
    started = time.perf_counter()
    released = shutdown.hand_back(runner, drain_seconds=settings.shutdown_drain_budget(elapsed=elapsed))
    events.put(("handed_back", index, released, round(time.perf_counter() - started, 3)))
    runner.close_io()
    heartbeat.shutdown()


class Pool:
    """The worker processes by index; a restart replaces one."""

    def __init__(self) -> None:
        self.ctx = mp.get_context("spawn")
        self.events = self.ctx.Queue()
        self.procs: dict[int, Any] = {}
        self.handed_back: list[tuple[int, int, float]] = []
        self.serving: dict[int, int] = {}  # worker -> requests in its engine when it first served

    def start(self, index: int) -> None:
        proc = self.ctx.Process(target=_worker, args=(index, self.events), daemon=True)
        proc.start()
        self.procs[index] = proc

    def wait_serving(self, indexes: set[int], *, timeout: float = 180) -> None:
        """Until each of these workers (their current process) has work in its engine."""
        deadline, waiting = time.monotonic() + timeout, set(indexes)
        while waiting:
            event = self.events.get(timeout=max(0.1, deadline - time.monotonic()))
            if event[0] == "handed_back":
                self.handed_back.append(event[1:])
            elif event[0] == "serving" and event[2] == self.procs[event[1]].pid:
                waiting.discard(event[1])
                self.serving[event[1]] = event[3]

    def stop(self, index: int, sig: int) -> tuple[float, int | None]:
        """Signal one worker and wait for it to exit: (seconds, exit code)."""
        proc, started = self.procs[index], time.perf_counter()
        os.kill(proc.pid, sig)
        proc.join(120)
        return round(time.perf_counter() - started, 2), proc.exitcode

    def collect(self) -> None:
        while not self.events.empty():
            event = self.events.get()
            if event[0] == "handed_back":
                self.handed_back.append(event[1:])


def _db() -> Any:
    from storage.db import get_engine

    return get_engine()


def _open_requests(batch_ids: list[str]) -> int:
    import sqlalchemy as sa

    query = sa.text("SELECT count(*) FROM batch_requests WHERE batch_id = ANY(:ids) AND status IN ('queued','running')")
    with _db().connect() as conn:
        return int(conn.execute(query, {"ids": batch_ids}).scalar_one())


def _pause(batch_id: str, seconds: float) -> None:
    """Pause one batch (its running requests go back to the queue), wait, resume it."""
    from storage.batches.control import pause_batch, resume_batch
    from storage.db import transaction
    from storage.models import Batch

    with transaction() as session:
        batch = session.get(Batch, batch_id)
        assert batch is not None
        tenant_id = batch.tenant_id
        pause_batch(session, tenant_id=tenant_id, batch_id=batch_id)
    time.sleep(seconds)  # the paused span itself (a benchmark's schedule, not a synchronisation)
    with transaction() as session:
        resume_batch(session, tenant_id=tenant_id, batch_id=batch_id)


def _reap() -> None:
    from storage.db import transaction
    from worker.jobs.reaper import reap

    with transaction() as session:
        reap(session)


def output_lines(batch_ids: list[str]) -> list[dict[str, Any]]:
    """Finalize the batches; every line of their output and error files."""
    return result_lines(_db(), batch_ids)


def run(mode: str, args: argparse.Namespace) -> dict[str, Any]:
    """One rolling restart (`term` or `kill`) to the end of the queue; its decode and exactly-once figures."""
    from worker.engine.decode_ledger import decode_figures, read_ledger

    ledger = Path(tempfile.mkdtemp(prefix=f"ledger-{mode}-", dir=OUT))
    extra = {"decode_ledger_dir": str(ledger)}
    spec = {"path": "fake:gpu-timed", "max_num_seqs": args.slots, "extra": extra}
    os.environ["BACKFILL_MODELS"] = json.dumps({MODEL: spec})
    prepare()  # a fresh database; the settings read again (with the model above)
    batches = enqueue(args.requests, low=args.low, high=args.high, seed=5, prompt_tokens=0)
    batch_ids, total = list(batches), sum(batches.values())
    pool = Pool()
    for index in range(WORKERS):
        pool.start(index)
    began = time.perf_counter()
    pool.wait_serving(set(range(WORKERS)))
    time.sleep(args.restart_after)  # let every worker's generations grow long before the first restart
    restarts = []
    for index in range(WORKERS):
        seconds, code = pool.stop(index, signal.SIGTERM if mode == "term" else signal.SIGKILL)
        pool.start(index)
        pool.wait_serving({index})
        restarts.append({"worker": index, "exit_seconds": seconds, "exit_code": code, "took": pool.serving[index]})
        if mode == "term" and index == 1:
            _pause(batch_ids[0], args.pause_seconds)
    restarted = time.perf_counter() - began
    last_reap = 0.0
    while _open_requests(batch_ids):
        if time.perf_counter() - last_reap >= 1.0:
            last_reap = time.perf_counter()
            _reap()
        if time.perf_counter() - began > 1800:
            raise RuntimeError(f"{mode}: {_open_requests(batch_ids)} requests still open after 30 min")
        time.sleep(0.5)
    wall = time.perf_counter() - began
    for index in range(WORKERS):
        pool.stop(index, signal.SIGTERM)
    pool.collect()
    lines = output_lines(batch_ids)
    seen = Counter(str(line["custom_id"]) for line in lines)
    ok = [line for line in lines if (line.get("response") or {}).get("status_code") == 200]
    delivered = {str(line["id"]): int(line["response"]["body"]["usage"]["completion_tokens"]) for line in ok}
    figures = decode_figures(read_ledger(ledger), delivered)
    worst = max(figures.discarded_by_request.values(), default=0)
    return {
        "mode": mode,
        "requests": total,
        "wall_seconds": round(wall, 1),
        "restarts_seconds": round(restarted, 1),
        "restarts": restarts,
        "handed_back": [{"worker": w, "released": n, "seconds": s} for w, n, s in pool.handed_back],
        "lost": total - len(seen),
        "duplicated": sum(n - 1 for n in seen.values()),
        "error_lines": len(lines) - len(ok),
        "decoded": figures.decoded,
        "delivered": figures.delivered,
        "resumed": figures.resumed,
        "discarded": figures.discarded,
        "undelivered_decoded": figures.undelivered_decoded,
        "unaccounted": figures.unaccounted,
        "share": round(figures.share, 7) if figures.share is not None else None,
        "requests_discarding": len(figures.discarded_by_request),
        "most_discarded_by_one_request": worst,
    }


def checkpoint_bound(slots: int) -> int:
    """Tokens a killed request may lose (docs/workers.md): fewer than every_tokens, plus what it decodes between
    two periodic checkpoints (at most the interval plus the 2 s renewal that checks it, plus 1 s for the write)
    at the step time of a full engine (`slots` sequences: the workers here run full when they are killed)."""
    from storage.settings import get_settings
    from worker.engine.timed_fake import TimedFakeEngine
    from worker.feed.runner import RENEW_SECONDS

    settings = get_settings()
    step = TimedFakeEngine(max_num_seqs=slots, timed=False).step_time(slots)
    seconds = settings.checkpoint_interval_seconds + RENEW_SECONDS + 1.0
    return settings.checkpoint_every_tokens + math.ceil(seconds / step)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--slots", type=int, default=384, help="max_num_seqs of each worker's engine")
    parser.add_argument("--requests", type=int, default=9216, help="enough that the queue outlasts the restarts")
    parser.add_argument("--low", type=int, default=300, help="shortest output, tokens")
    parser.add_argument("--high", type=int, default=1500, help="longest output, tokens")
    parser.add_argument("--restart-after", type=float, default=6.0, help="seconds of serving before the first restart")
    parser.add_argument("--pause-seconds", type=float, default=3.0)
    parser.add_argument("--modes", default="term,kill")
    args = parser.parse_args()
    if args.quick:
        args.slots, args.requests, args.low, args.high, args.restart_after = 32, 1024, 100, 400, 3.0
    OUT.mkdir(parents=True, exist_ok=True)
    os.environ.update(
        {
            "BACKFILL_DATA_DIR": tempfile.mkdtemp(prefix="rolling-", dir=OUT),
            "BACKFILL_HEARTBEAT_SECONDS": "1",
            "BACKFILL_WORKER_STALE_SECONDS": "3",
            "BACKFILL_ADMISSION_POLICY": "off",
            # A short drain, so the SIGTERM hands long generations back mid-way (the production path, a shorter
            # wait); periodic checkpoints often enough that a kill's loss is bounded tightly.
            "BACKFILL_SHUTDOWN_DRAIN_SECONDS": "2",
            "BACKFILL_CHECKPOINT_EVERY_TOKENS": "64",
            "BACKFILL_CHECKPOINT_INTERVAL_SECONDS": "1",
        }
    )
    runs = {mode: run(mode, args) for mode in args.modes.split(",")}
    for figures in runs.values():
        print(json.dumps(figures), flush=True)
    result: dict[str, Any] = {"slots": args.slots, "workers": WORKERS, "runs": runs}
    result["checkpoint_bound_tokens"] = checkpoint_bound(args.slots)
    result["checkpoint_every_tokens"], result["checkpoint_interval_seconds"] = 64, 1.0
    print(json.dumps({k: v for k, v in result.items() if k != "runs"}))
    (OUT / "rolling-restart.json").write_text(json.dumps({"result": result}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
