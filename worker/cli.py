"""The `backfill` command: serve, migrate, keys, worker, beat, demo-model, plan and more.

This module is the composition root: it is the one place that wires the API, storage and worker
together for a process.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path

from storage.settings import SettingsError, get_settings

log = logging.getLogger("backfill")

Command = Callable[[argparse.Namespace], int]


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `backfill` console script."""
    logging.basicConfig(
        level=os.environ.get("BACKFILL_LOG_LEVEL", "INFO"), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    parser = build_parser()
    args = parser.parse_args(argv)
    if not hasattr(args, "func"):
        parser.print_help()
        return 2
    try:
        get_settings()
        return int(args.func(args))
    except SettingsError as error:
        print(f"backfill: {error}", file=sys.stderr)
        return 2


def build_parser() -> argparse.ArgumentParser:
    """All subcommands; each has --help."""
    parser = argparse.ArgumentParser(prog="backfill", description="Self-hosted, OpenAI-compatible Batch API.")
    sub = parser.add_subparsers(title="commands", metavar="COMMAND")

    serve = sub.add_parser("serve", help="run the API (and, with no broker configured, the worker in-process)")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    serve.set_defaults(func=cmd_serve)

    migrate = sub.add_parser("migrate", help="apply database migrations")
    migrate.set_defaults(func=cmd_migrate)

    keys = sub.add_parser("keys", help="manage API keys")
    keys_sub = keys.add_subparsers(title="key commands", metavar="KEYCOMMAND")
    create = keys_sub.add_parser("create", help="create an API key (printed once, alone on the last line)")
    create.add_argument("--tenant", required=True, help="tenant name (created if new)")
    create.add_argument("--admin", action="store_true", help="may read every tenant's cost reports")
    create.set_defaults(func=cmd_keys_create)

    worker = sub.add_parser(
        "worker",
        help="run a Celery worker (gpu: the engine for one model, or several one at a time; io: ingest/finalize)",
    )
    worker.add_argument("--role", choices=("gpu", "io"), default="gpu")
    worker.add_argument(
        "--model", help="served model name (default BACKFILL_WORKER_MODEL or the first in the registry)"
    )
    worker.add_argument(
        "--models", help="several models, one loaded at a time: 'a,b' or 'all' (default BACKFILL_WORKER_MODELS)"
    )
    worker.set_defaults(func=cmd_worker)

    beat = sub.add_parser("beat", help="run the periodic jobs (lease reaper, expiry, wake-ups)")
    beat.set_defaults(func=cmd_beat)

    demo = sub.add_parser("demo-model", help="build the tiny offline demo model into PATH")
    demo.add_argument("path", type=Path)
    demo.set_defaults(func=cmd_demo_model)

    for name in ("plan", "estimate", "report"):
        try:
            module = __import__(f"worker.commands.{name}", fromlist=["register"])
        except ImportError:
            continue
        module.register(sub)
    return parser


def migrate_database() -> None:
    """Upgrade the configured database to the newest migration."""
    from alembic import command
    from alembic.config import Config

    root = Path(__file__).resolve().parent.parent
    config = Config(str(root / "alembic.ini"))
    config.set_main_option("script_location", str(root / "migrations"))
    command.upgrade(config, "head")


def cmd_migrate(_: argparse.Namespace) -> int:
    migrate_database()
    print("database is up to date")
    return 0


def cmd_keys_create(args: argparse.Namespace) -> int:
    from storage.db import transaction
    from storage.tenants import create_api_key

    with transaction() as session:
        key = create_api_key(session, tenant_name=args.tenant, is_admin=args.admin)
    kind = "admin key" if args.admin else "key"
    print(f"created {kind} for tenant '{args.tenant}'; it is shown only once:")
    print(key)
    return 0


def ensure_demo_model() -> None:
    """The embedded default serves the demo model; build it on first start."""
    settings = get_settings()
    if settings.models:
        return
    from worker.demo_model import build_demo_model

    spec = settings.served_models()["backfill-demo"]
    build_demo_model(Path(spec.path))


def _first_run_key() -> str | None:
    """On a fresh embedded install, create a key for tenant 'default' and keep it in data_dir."""
    from sqlalchemy import select

    from storage.db import transaction
    from storage.models import ApiKey
    from storage.tenants import create_api_key

    settings = get_settings()
    path = settings.data_dir / "default-api-key"
    with transaction() as session:
        if session.scalar(select(ApiKey.id).limit(1)) is not None:
            return None
        key = create_api_key(session, tenant_name="default")
    path.write_text(key + "\n")
    path.chmod(0o600)
    return key


def cmd_serve(args: argparse.Namespace) -> int:
    import uvicorn

    from api.app import create_app

    settings = get_settings()
    embedded_worker = None
    if settings.embedded:
        settings.data_dir.mkdir(parents=True, exist_ok=True)
        migrate_database()
        ensure_demo_model()
        key = _first_run_key()
        if key:
            print(
                f"first run: created an API key for tenant 'default' (also in {settings.data_dir / 'default-api-key'}):"
            )
            print(key, flush=True)
        from worker.embedded import EmbeddedWorker

        embedded_worker = EmbeddedWorker(reap_interval_seconds=settings.reap_interval_seconds)
        embedded_worker.start()

    def health_extra() -> dict[str, object]:
        if embedded_worker is None:
            return {"worker": "external"}
        if embedded_worker.error is not None:
            return {"worker": f"failed: {embedded_worker.error}"}
        return {"worker": "ready" if embedded_worker.ready.is_set() else "loading"}

    app = create_app(health_extra=health_extra)
    try:
        uvicorn.run(app, host=args.host, port=args.port, log_level="info")
    finally:
        if embedded_worker is not None:
            embedded_worker.shutdown()
    return 0


def cmd_worker(args: argparse.Namespace) -> int:
    settings = get_settings()
    if settings.redis_url is None:
        print("backfill: BACKFILL_REDIS_URL must be set to run a Celery worker", file=sys.stderr)
        return 2
    if args.model:
        os.environ["BACKFILL_WORKER_MODEL"] = args.model
        os.environ.pop("BACKFILL_WORKER_MODELS", None)
        get_settings.cache_clear()
    if args.models:
        os.environ["BACKFILL_WORKER_MODELS"] = args.models
        get_settings.cache_clear()
    from worker.celery_app import app

    if args.role == "gpu":
        from worker import service

        models = get_settings().current_worker_models()
        # Load an engine once, before the first task; several models share one engine slot.
        if service.serves_several_models():
            service.get_slot().warm()
        else:
            service.get_runner()
        queues = ",".join(f"gpu.{model}" for model in models)
        argv = ["worker", "-Q", queues, "-P", "solo", "-c", "1", "--prefetch-multiplier", "1"]
    else:
        argv = ["worker", "-Q", "default", "-P", "threads", "-c", "2"]
    app.worker_main([*argv, "--loglevel", "INFO", "-n", f"{args.role}@%h.{os.getpid()}"])
    return 0


def cmd_beat(_: argparse.Namespace) -> int:
    settings = get_settings()
    if settings.redis_url is None:
        print("backfill: BACKFILL_REDIS_URL must be set to run beat", file=sys.stderr)
        return 2
    from worker.celery_app import app

    settings.data_dir.mkdir(parents=True, exist_ok=True)
    app.start(["beat", "--loglevel", "INFO", "-s", str(settings.data_dir / "celerybeat-schedule")])
    return 0


def cmd_demo_model(args: argparse.Namespace) -> int:
    from worker.demo_model import build_demo_model

    path = build_demo_model(args.path)
    print(f"demo model ready at {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
