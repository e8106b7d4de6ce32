"""Shared setup for benchmarks: a throwaway embedded (or Postgres) Backfill and the demo model."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent
OUT = ROOT / "out"
PG_ADMIN = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"


def plot_dir() -> Path:
    """Where plots go: docs/ for a full run, `BACKFILL_BENCH_PLOT_DIR` (bench/out/plots) for a smoke run."""
    target = Path(os.environ.get("BACKFILL_BENCH_PLOT_DIR") or ROOT.parent / "docs")
    target.mkdir(parents=True, exist_ok=True)
    return target


def fresh_postgres(prefix: str = "backfill_bench") -> str | None:
    """Create an empty Postgres database for this run (dropped at exit); None if no server answers."""
    import atexit
    import uuid

    import sqlalchemy as sa

    name = f"{prefix}_{uuid.uuid4().hex[:8]}"
    admin = sa.create_engine(PG_ADMIN, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    except sa.exc.OperationalError:
        return None

    def drop() -> None:
        from storage.db import get_engine

        get_engine().dispose()
        with admin.connect() as conn:
            conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))

    atexit.register(drop)
    return f"postgresql://postgres@127.0.0.1:5432/{name}"


def prepare_env(*, database_url: str | None = None, max_num_seqs: int = 64) -> Path:
    """Point Backfill at a fresh data dir (and optionally Postgres); build the demo model once."""
    OUT.mkdir(exist_ok=True)
    for name, sub in (("TMPDIR", "tmp"), ("VLLM_CACHE_ROOT", "vllm-cache"), ("TORCHINDUCTOR_CACHE_DIR", "inductor")):
        (OUT / sub).mkdir(exist_ok=True)
        os.environ.setdefault(name, str(OUT / sub))
    tempfile.tempdir = None
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
    # The same engine settings the adapter uses, so the bare-vLLM baseline runs identically.
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")
    data = Path(tempfile.mkdtemp(prefix="bench-", dir=OUT))
    os.environ["BACKFILL_DATA_DIR"] = str(data)
    if database_url:
        os.environ["BACKFILL_DATABASE_URL"] = database_url
    from worker.engine.demo_model import build_demo_model

    model_dir = build_demo_model(OUT / "models" / "backfill-demo")
    registry = {
        "backfill-demo": {
            "path": str(model_dir),
            "max_num_seqs": max_num_seqs,
            "max_model_len": 2048,
            "dtype": "float32",
        }
    }
    os.environ["BACKFILL_MODELS"] = json.dumps(registry)
    from worker.cli.migrate import migrate_database

    migrate_database()
    return model_dir


def submit(
    lines: Iterable[dict[str, Any]],
    *,
    tenant: str = "bench",
    endpoint: str = "/v1/chat/completions",
    model: str = "backfill-demo",
    window: str = "24h",
) -> str:
    """Upload + create + ingest a batch through the storage layer; return its id."""
    from storage.batches.batches import create_batch
    from storage.db import transaction
    from storage.files.blobs import get_blob_store
    from storage.files.files import create_file
    from storage.settings import get_settings
    from storage.tenants import get_or_create_tenant
    from worker.jobs.ingest import ingest_batch

    chunks = (json.dumps(line).encode() + b"\n" for line in lines)
    with transaction() as session:
        tenant_row = get_or_create_tenant(session, name=tenant)
        source = create_file(
            session, get_blob_store(), tenant_id=tenant_row.id, filename="bench.jsonl", purpose="batch", chunks=chunks
        )
        batch = create_batch(
            session,
            tenant_id=tenant_row.id,
            input_file_id=source.id,
            endpoint=endpoint,
            completion_window=window,
            model=model,
            metadata=None,
        )
    with transaction() as session:
        ingest_batch(session, get_blob_store(), get_settings(), batch_id=batch.id)
    return batch.id


def chat_line(i: int, max_tokens: int) -> dict[str, Any]:
    return {
        "custom_id": f"r{i}",
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {
            "model": "backfill-demo",
            "messages": [{"role": "user", "content": f"Write a function number {i} that adds two numbers."}],
            "max_tokens": max_tokens,
            "ignore_eos": True,
        },
    }


def result_lines(engine: Any, batch_ids: list[str]) -> list[dict[str, Any]]:
    """Finalize the batches; every line of their output and error files (bench/workers.py, bench/rolling_restart.py)."""
    import sqlalchemy as sa

    from storage.files.blobs import get_blob_store
    from worker.jobs.finalize import finalize_batch

    blobs = get_blob_store()
    for batch_id in batch_ids:
        finalize_batch(blobs, batch_id=batch_id)
    query = sa.text(
        "SELECT f.blob_key FROM batches b JOIN files f ON f.id IN (b.output_file_id, b.error_file_id)"
        " WHERE b.id = ANY(:ids)"
    )
    with engine.connect() as conn:
        keys = [key for (key,) in conn.execute(query, {"ids": batch_ids})]
    return [json.loads(line) for key in keys for line in b"".join(blobs.open_stream(key)).splitlines() if line.strip()]
