"""The worker's process-wide state and its unit operations, shared by Celery tasks and the embedded loop.

The engine is loaded once per process and kept warm; every operation re-reads the database first, so
running one twice (a duplicate wake-up, a redelivered task) does nothing harmful.
"""

from __future__ import annotations

import logging
import threading
import time

from sqlalchemy import select

from storage import lifecycle
from storage.blobs import get_blob_store
from storage.db import get_engine, transaction
from storage.models import Batch
from storage.settings import Settings, get_settings
from storage.wakeups import wake_after_commit
from worker.engine import Engine
from worker.finalize import finalize_batch
from worker.ingest import ingest_batch
from worker.reaper import Reaped, reap
from worker.runner import Runner
from worker.slot.engine_slot import EngineSlot

log = logging.getLogger(__name__)

_runners: dict[str, Runner] = {}
_slots: list[EngineSlot] = []  # a worker serving several models one at a time (BACKFILL_WORKER_MODELS)
_runner_lock = threading.Lock()


def load_engine(settings: Settings, model: str) -> Engine:
    """Build the engine for `model` from the registry (the only path to vLLM)."""
    spec = settings.served_models()[model]
    if spec.path.startswith("fake:"):
        from worker.engine.fake import FakeEngine

        return FakeEngine(
            model_name=model,
            max_num_seqs=spec.resolved_max_num_seqs(),
            runner=spec.runner,
            max_model_len=spec.max_model_len or 2048,
            step_seconds=float(spec.extra.get("step_seconds", 0.0)),
        )
    if spec.shared is not None:  # shared mode: a vLLM server that also serves online users
        from worker.engine.http_engine import HttpEngine

        return HttpEngine(model, spec)
    from worker.engine.vllm_engine import VllmEngine

    return VllmEngine(model, spec)


def get_runner(model: str | None = None) -> Runner:
    """The process's runner for `model` (default: the worker's model), loading its engine on first use."""
    settings = get_settings()
    name = model or settings.current_worker_model()
    with _runner_lock:
        if name not in _runners:
            started = time.perf_counter()
            engine = load_engine(settings, name)
            log.info("engine for %s loaded in %.1f s", name, time.perf_counter() - started)
            _runners[name] = Runner(engine, model=name, settings=settings, on_batch_done=request_finalize)
        return _runners[name]


def serves_several_models() -> bool:
    """True when this worker serves several models through one engine slot (BACKFILL_WORKER_MODELS)."""
    return len(get_settings().current_worker_models()) > 1


def get_slot() -> EngineSlot:
    """The process's engine slot for its models (BACKFILL_WORKER_MODELS), loading nothing until asked."""
    settings = get_settings()
    with _runner_lock:
        if not _slots:
            slot = EngineSlot(
                settings.current_worker_models(),
                settings,
                load=lambda s, model: load_engine(s, model),
                on_batch_done=request_finalize,
            )
            _slots.append(slot)
        return _slots[0]


def drop_runners() -> None:
    """Forget loaded engines (tests switch settings between cases)."""
    with _runner_lock:
        _runners.clear()
        _slots.clear()


def request_finalize(batch_id: str) -> None:
    """Wake finalize for a batch whose last request just ended."""
    with transaction() as session:
        wake_after_commit(session, "batch.finalize", batch_id=batch_id)


def ingest(batch_id: str) -> str:
    """Validate and enqueue one batch; wake the GPU worker for its model."""
    settings = get_settings()
    with transaction() as session:
        status = ingest_batch(session, get_blob_store(), settings, batch_id=batch_id)
        batch = session.get(Batch, batch_id)
        enqueued = batch.request_total if batch is not None and status == lifecycle.IN_PROGRESS else 0
        if enqueued and batch is not None and batch.model:
            wake_after_commit(session, "batch.run", model=batch.model)
    if enqueued >= ANALYZE_AFTER_ROWS:
        refresh_queue_statistics()
    return status


ANALYZE_AFTER_ROWS = 5000


def refresh_queue_statistics() -> None:
    """Re-sample the queue table after a big ingest, so claims use the queue indexes at once.

    Postgres' autovacuum would get there within a minute or so; until then the planner believes the
    queue is tiny, picks the wrong index for a tenant's claim and each claim costs several times more
    (measured: 2,400 vs 5,000 claims+results per second on 20,000 fresh rows). SQLite has no such planner issue.
    """
    engine = get_engine()
    if engine.dialect.name != "postgresql":
        return
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
        connection.exec_driver_sql("ANALYZE batch_requests")


def finalize(batch_id: str) -> str | None:
    """Write a finished batch's result files."""
    return finalize_batch(get_blob_store(), batch_id=batch_id)


def reap_once() -> Reaped:
    """One reaper pass, then wake whoever has work."""
    with transaction() as session:
        result = reap(session)
        for batch_id in result.ready_to_finalize:
            wake_after_commit(session, "batch.finalize", batch_id=batch_id)
        for model in result.models_with_work:
            wake_after_commit(session, "batch.run", model=model)
        for batch_id in pending_ingest(session):
            wake_after_commit(session, "batch.ingest", batch_id=batch_id)
    return result


def pending_ingest(session) -> list[str]:  # type: ignore[no-untyped-def]
    """Batches still waiting for validation."""
    return list(session.scalars(select(Batch.id).where(Batch.status == lifecycle.VALIDATING)))
