"""`backfill worker`: a Celery worker; `gpu` holds a warm engine, `io` ingests and finalizes."""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

from storage.settings import get_settings


def register(subparsers: Any) -> None:
    """Add the `worker` subcommand."""
    parser = subparsers.add_parser(
        "worker",
        help="run a Celery worker (gpu: the engine for one model, or several one at a time; io: ingest/finalize)",
    )
    parser.add_argument("--role", choices=("gpu", "io"), default="gpu")
    parser.add_argument(
        "--model", help="served model name (default BACKFILL_WORKER_MODEL or the first in the registry)"
    )
    parser.add_argument(
        "--models", help="several models, one loaded at a time: 'a,b' or 'all' (default BACKFILL_WORKER_MODELS)"
    )
    parser.add_argument(
        "--metrics-port", type=int, help="serve /metrics on this port (default BACKFILL_METRICS_PORT; 0: off)"
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Load the engine (gpu) and hand the process to Celery."""
    settings = get_settings()
    if settings.redis_url is None:
        print("backfill: BACKFILL_REDIS_URL must be set to run a Celery worker", file=sys.stderr)
        return 2
    from storage.metrics import serve_metrics
    from worker.feed.feeder import Feeder
    from worker.process import readiness, service, shutdown
    from worker.process.celery_app import app

    port = settings.metrics_port if args.metrics_port is None else args.metrics_port
    serve_metrics(port, role=f"worker-{args.role}", ready=readiness.is_ready)
    feeder: Feeder | None = None  # an io worker holds no engine work
    if args.role == "gpu":
        if args.models:
            every = list(settings.served_models())
            service.serve_models(every if args.models.strip() == "all" else _names(args.models))
        elif args.model:
            service.serve_models([args.model])
        models = service.worker_models()
        feeder = service.get_feeder()
        feeder.warm()  # load an engine once, before the first task
        # Each GPU worker also listens on a queue of its own: it wakes itself (liveness heartbeat, the end of
        # a task with work left), so every live worker stays fed and held work never changes hands.
        own = f"worker.{service.identity().worker_id}"

        def wake() -> None:
            app.send_task("batch.run", kwargs={"model": feeder.model if feeder.model else models[0]}, queue=own)

        service.start_liveness(wake=wake)
        queues = ",".join([*(f"gpu.{model}" for model in models), own])
        argv = ["worker", "-Q", queues, "-P", "solo", "-c", "1", "--prefetch-multiplier", "1"]
    else:
        argv = ["worker", "-Q", "default", "-P", "threads", "-c", "2"]
    shutdown.install(feeder, settings=settings)  # SIGTERM: checkpoint, hand work back, exit inside the grace
    try:
        app.worker_main([*argv, "--loglevel", "INFO", "-n", f"{args.role}@%h.{os.getpid()}"])
    finally:
        service.stop_liveness()  # after the hand-back: drop the heartbeat row, nobody waits for it to go stale
    # Celery returns here after a stop it was asked for (SIGTERM, SIGINT: `shutdown.stopping`) and after
    # one it chose, on an "Unrecoverable error" (e.g. kombu failing in an ack while Redis restarts; found by
    # `make chaos`); its exit code does not reach us. After the second the worker starts itself again (a
    # fresh process image: nothing of the broken connection survives), so ingest, finalize and the reaper
    # come back with no supervisor; after RESTARTS_MAX quick restarts in a row it exits 1 instead.
    if shutdown.stopping.is_set():
        return 0
    return _restart(args)


RESTARTS_MAX = 10  # quick restarts in a row (each within RESTART_QUICK_SECONDS of its start) before giving up
RESTART_QUICK_SECONDS = 60.0
_RESTARTS_ENV = "_BACKFILL_WORKER_RESTARTS"  # not a setting: the count one image hands the next
_STARTED = time.monotonic()


def _restart(args: argparse.Namespace) -> int:
    quick = int(os.environ.get(_RESTARTS_ENV, "0")) + 1 if time.monotonic() - _STARTED < RESTART_QUICK_SECONDS else 1
    if quick > RESTARTS_MAX:
        print(f"backfill: the Celery worker stopped on its own {quick - 1} times in a row; exiting 1", file=sys.stderr)
        return 1
    print("backfill: the Celery worker stopped on its own (see the log above); restarting", file=sys.stderr, flush=True)
    time.sleep(min(quick, 5))
    argv = [sys.executable, "-m", "worker.cli", "worker", "--role", args.role]
    for flag, value in (("--model", args.model), ("--models", args.models), ("--metrics-port", args.metrics_port)):
        if value is not None:
            argv += [flag, str(value)]
    os.execve(sys.executable, argv, {**os.environ, _RESTARTS_ENV: str(quick)})
    return 1  # not reached


def _names(text: str) -> list[str]:
    return [name.strip() for name in text.split(",") if name.strip()]
