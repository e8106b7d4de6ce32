"""`backfill serve`: the API, and with no broker configured the in-process worker (the embedded default)."""

from __future__ import annotations

import argparse
import ipaddress
import signal
from pathlib import Path
from typing import Any

from storage.settings import SettingsError, get_settings


def register(subparsers: Any) -> None:
    """Add the `serve` subcommand."""
    parser = subparsers.add_parser("serve", help="run the API (and, with no broker configured, the worker in-process)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.set_defaults(func=run)


def metrics_exposure_problem(host: str, *, token: str | None) -> str | None:
    """Why serving on `host` would expose /metrics (queue depths, tenant names) to whoever reaches it, if it
    would: any address but loopback needs BACKFILL_METRICS_TOKEN."""
    if token is not None:
        return None
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: it may resolve anywhere
        loopback = False
    if loopback:
        return None
    return (
        f"BACKFILL_METRICS_TOKEN is required when the API listens beyond loopback (--host {host}): /metrics shows "
        "queue depths and tenant names. Set it to a long random string and give Prometheus the same bearer token."
    )


def ensure_demo_model() -> None:
    """The embedded default serves the demo model; build it on first start."""
    settings = get_settings()
    if settings.models:
        return
    from worker.engine.demo_model import build_demo_model

    spec = settings.served_models()["backfill-demo"]
    build_demo_model(Path(spec.path))
    from storage.registry import DEMO_LORA_MODEL
    from worker.engine.demo_adapter import build_demo_adapters

    adapters = settings.served_models()[DEMO_LORA_MODEL].adapters
    build_demo_adapters({name: Path(path) for name, path in adapters.items()})  # the LoRA demo's adapters
    from storage.registry import DEMO_VL_MODEL
    from worker.engine.demo_vl_model import build_demo_vl_model

    build_demo_vl_model(Path(settings.served_models()[DEMO_VL_MODEL].path))  # the vision-language demo model
    from storage.registry import DEMO_MODERATION_MODEL
    from worker.engine.demo_moderation_model import build_demo_moderation_model

    build_demo_moderation_model(Path(settings.served_models()[DEMO_MODERATION_MODEL].path))  # for /v1/moderations
    from storage.registry import DEMO_EMBEDDING_MODEL
    from worker.engine.demo_embedding_model import build_demo_embedding_model

    build_demo_embedding_model(Path(settings.served_models()[DEMO_EMBEDDING_MODEL].path))  # Matryoshka embeddings


def _first_run_key() -> str | None:
    """On a fresh embedded install, create a key for tenant 'default' and keep it in data_dir."""
    from storage.db import transaction
    from storage.tenants import any_api_key, create_api_key

    settings = get_settings()
    path = settings.data_dir / "default-api-key"
    with transaction() as session:
        if any_api_key(session):
            return None
        key = create_api_key(session, tenant_name="default")
    path.write_text(key + "\n")
    path.chmod(0o600)
    return key


def run(args: argparse.Namespace) -> int:
    """Serve until interrupted; the embedded worker stops with the server."""
    import uvicorn

    from api.app import create_app
    from api.logs import uvicorn_log_config
    from worker.cli.migrate import migrate_database

    settings = get_settings()
    problem = metrics_exposure_problem(args.host, token=settings.metrics_token)
    if problem is not None:
        raise SettingsError(problem)
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
        from worker.process.embedded import EmbeddedWorker

        embedded_worker = EmbeddedWorker(reap_interval_seconds=settings.reap_interval_seconds)
        embedded_worker.start()

    def health_extra() -> dict[str, object]:
        if embedded_worker is None:
            return {"worker": "external"}
        if embedded_worker.error is not None:
            return {"worker": f"failed: {embedded_worker.error}"}
        return {"worker": "ready" if embedded_worker.ready.is_set() else "loading"}

    app = create_app(health_extra=health_extra)
    # uvicorn re-raises the SIGTERM it stopped on once it is done: with the default action the process would die
    # there, before the embedded worker below hands its in-flight work back with its checkpoints.
    signal.signal(signal.SIGTERM, lambda *_: None)
    try:
        uvicorn.run(app, host=args.host, port=args.port, log_level="info", log_config=uvicorn_log_config())
    finally:
        if embedded_worker is not None:
            embedded_worker.shutdown()
    return 0
