"""The worker's process-wide state and its unit operations, shared by Celery tasks and the embedded loop.

The engine is loaded once per process and kept warm; every operation re-reads the database first, so
running one twice (a duplicate wake-up, a redelivered task) does nothing harmful.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

from sqlalchemy.orm import Session

from storage import lifecycle
from storage.batches.archive import archive_due
from storage.batches.batches import batches_validating, get_batch, note_ingest_failure
from storage.db import transaction
from storage.files.blobs import get_blob_store
from storage.files.retention import sweep_expired_files
from storage.files.uploads import sweep_uploads
from storage.protocols import PROTOCOLS
from storage.queue.backlog import batch_done
from storage.queue.batch_rows import queued_models
from storage.queue.enqueue import refresh_statistics
from storage.queue.workers import WorkerIdentity
from storage.settings import Settings, SettingsError, get_settings
from storage.wakeups import get_waker, wake_after_commit
from worker.engine import Engine
from worker.engine.factory import load_engine
from worker.feed.feeder import Feeder, make_feeder
from worker.feed.runner import Runner
from worker.feed.slot import EngineSlot
from worker.jobs.finalize import finalize_batch
from worker.jobs.ingest import ingest_batch
from worker.jobs.reaper import Reaped, reap
from worker.process.liveness import Heartbeat, SelfWake, make_identity

log = logging.getLogger(__name__)

# Per model set: the registry entries it was built from, the settings it claims and prices with, and the feeder.
# An entry that changed gets a new engine; the old one is closed first, so a process never serves a stale spec.
# Other settings that changed (a price book, caps, intervals) get a new runner around the same warm engine.
_feeders: dict[tuple[str, ...], tuple[str, str, Feeder]] = {}
_worker_models: list[str] = []  # set by `backfill worker --model/--models`; else the settings decide
_lock = threading.Lock()
_identity: list[WorkerIdentity] = []
_liveness: list[Heartbeat] = []
# Finalize wake-ups go out from here, off the engine's thread: a broker that is down may take seconds to refuse.
_finalizer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="backfill-finalize")


def identity() -> WorkerIdentity:
    """This process's worker identity (the lease owner of everything its runners claim)."""
    with _lock:
        if not _identity:
            _identity.append(make_identity(get_settings()))
        return _identity[0]


def start_liveness(*, wake: Callable[[], None] | None = None) -> Heartbeat:
    """Register this worker (taking over its predecessor's leases) and start its heartbeat thread.

    `wake` sends `batch.run` to this worker's own queue (Celery): the heartbeat calls it when the worker
    idles while its models have queued work, and `run_task_ended` when a task stops with work left.
    """
    with _lock:
        if _liveness:
            return _liveness[0]
        feeders = [feeder for _, _, feeder in _feeders.values()]
    models = list(dict.fromkeys(model for feeder in feeders for model in feeder.models))
    heartbeat = Heartbeat(
        identity(),
        get_settings(),
        models=models,
        runners=_runners,
        self_wake=SelfWake(wake) if wake is not None else None,
    )
    heartbeat.start()
    with _lock:
        _liveness.append(heartbeat)
    return heartbeat


def shut_down() -> None:
    """A clean stop: hand held work back to the queue at once (no attempt used), then drop the worker's row."""
    for runner in _runners():
        try:
            runner.hand_back(drain_seconds=0.0)
        except Exception:  # the database is away: the reaper releases them once the row goes stale
            log.exception("could not hand back the work of %s", runner.model)
    stop_liveness()


def stop_liveness() -> None:
    """Stop the heartbeat and drop this worker's row."""
    with _lock:
        beats, _liveness[:] = list(_liveness), []
    for heartbeat in beats:
        heartbeat.shutdown()


def _runners() -> list[Runner]:
    with _lock:
        feeders = [feeder for _, _, feeder in _feeders.values()]
    return [runner for runner in map(_runner_of, feeders) if runner is not None]


def run_task_started() -> None:
    """A `batch.run` task begins: any self-wake on its way has arrived."""
    if _liveness and _liveness[0].self_wake is not None:
        _liveness[0].self_wake.task_started()


def run_task_ended(*, model: str | None, more: bool) -> None:
    """A `batch.run` task ended: with work left, wake this same worker again (its own queue, else the model's)."""
    wake = _liveness[0].self_wake if _liveness else None
    if wake is not None:
        wake.task_ended(more=more)
    elif more and model is not None:
        get_waker().send("batch.run", {"model": model})


def serve_models(models: Sequence[str]) -> None:
    """Make this process serve `models` (the worker command's --model/--models), whatever the settings say."""
    served = get_settings().served_models()
    unknown = [model for model in models if model not in served]
    if unknown or not models:
        raise SettingsError(f"not in BACKFILL_MODELS: {', '.join(unknown) or '(none given)'}")
    with _lock:
        _worker_models[:] = list(dict.fromkeys(models))


def worker_models() -> list[str]:
    """The models this worker serves: as `serve_models` set them, else BACKFILL_WORKER_MODELS / WORKER_MODEL."""
    with _lock:
        if _worker_models:
            return list(_worker_models)
    return get_settings().current_worker_models()


def get_feeder(models: Sequence[str] | None = None) -> Feeder:
    """The process's feeder for `models` (default: the worker's), built on first use (one place decides how)."""
    settings = get_settings()
    names = tuple(models or worker_models())
    worker_id = identity().worker_id
    served = settings.served_models()
    specs = json.dumps([served[name].model_dump(mode="json") if name in served else None for name in names])
    rest = settings.model_dump_json()
    with _lock:
        built = _feeders.get(names)
        if built is not None and built[:2] == (specs, rest) and not _io_closed(built[2]):
            return built[2]
        load: Callable[[Settings, str], Engine] = load_engine
        old = built[2] if built is not None and built[0] == specs else None
        if isinstance(old, Runner) and not old.io.closed and not old.inflight:
            # The same engine, other settings: a runner claiming under the old ones would price a spend cap with
            # another price book (CI once billed a $10-capped batch $160). Its idle engine stays warm for the new one.
            log.info("settings of %s changed: a new runner around its engine", ", ".join(names))
            old.close_io()
            load = _loaded(old.engine)
        elif built is not None:  # a changed entry, a closed runner (a switch, a shutdown), or a busy engine
            log.info("%s: entry or settings changed, or runner closed: closing its engine", ", ".join(names))
            _close(built[2])
        started = time.perf_counter()
        feeder = make_feeder(names, settings, load=load, on_batch_done=request_finalize, worker_id=worker_id)
        _feeders[names] = (specs, rest, feeder)
        log.info("feeder for %s ready in %.1f s", ", ".join(names), time.perf_counter() - started)
        return feeder


def get_runner(model: str | None = None) -> Runner:
    """The runner of one model (default: the worker's only model); benchmarks and tests reach in through it."""
    feeder = get_feeder([model] if model else None)
    if not isinstance(feeder, Runner):
        raise TypeError(f"this worker serves {', '.join(feeder.models)} through an engine slot, not one runner")
    return feeder


def get_slot() -> EngineSlot:
    """The engine slot of a worker serving several models one at a time."""
    feeder = get_feeder()
    if not isinstance(feeder, EngineSlot):
        raise TypeError(f"this worker serves only {', '.join(feeder.models)}: there is no engine slot")
    return feeder


def embedded_feeders() -> list[Feeder]:
    """The embedded worker's feeders: the worker models (one slot if several) and one runner per other model."""
    shared = worker_models() if len(worker_models()) > 1 else []
    feeders = [get_feeder(shared)] if shared else []
    feeders += [get_feeder([model]) for model in get_settings().served_models() if model not in shared]
    return feeders


def close_engines() -> None:
    """Close every loaded engine (its memory and connections) and forget the feeders."""
    with _lock:
        feeders = [feeder for _, _, feeder in _feeders.values()]
    for feeder in feeders:
        _close(feeder)
    drop_runners()


def _loaded(engine: Engine) -> Callable[[Settings, str], Engine]:
    """A `load` that hands back this engine, already loaded, instead of loading one."""
    return lambda _settings, _model: engine


def _runner_of(feeder: Feeder) -> Runner | None:
    """A feeder's runner: itself, an engine slot's current one, or none."""
    return feeder if isinstance(feeder, Runner) else feeder.runner if isinstance(feeder, EngineSlot) else None


def _io_closed(feeder: Feeder) -> bool:
    """Whether this feeder's runner can no longer claim or write (its I/O threads were closed)."""
    runner = _runner_of(feeder)
    return runner is not None and runner.io.closed


def _close(feeder: Feeder) -> None:
    runner = _runner_of(feeder)
    if runner is not None:
        runner.close_io()
        runner.engine.close()


def drop_runners() -> None:
    """Forget loaded engines, the --model choice and the heartbeat (tests switch settings between cases)."""
    stop_liveness()
    with _lock:
        _feeders.clear()
        _worker_models.clear()
        _identity.clear()


def request_finalize(batch_id: str) -> None:
    """Get a batch whose last request just ended finalized: wake the io worker, or do it here if the broker is down."""
    _finalizer.submit(_finalize_soon, batch_id)


def _finalize_soon(batch_id: str) -> None:
    try:
        get_waker().send("batch.finalize", {"batch_id": batch_id})
        return
    except Exception:
        log.warning("could not wake finalize for batch %s (broker down?); finalizing it in this worker", batch_id)
    try:
        finalize(batch_id)
    except Exception:  # the reaper finds the batch again (batches_ready_to_finalize)
        log.exception("finalizing batch %s in the GPU worker failed", batch_id)


def ingest(batch_id: str) -> str:
    """Validate and enqueue one batch; wake the GPU worker for its model.

    An error no line explains is counted on the batch (back-off, then `ingest_failed`): one batch's
    failure never reaches the caller, so the embedded loop and a Celery worker go on serving the rest.
    """
    try:
        return _ingest(batch_id)
    except Exception as error:
        log.exception("ingest of batch %s failed", batch_id)
        settings = get_settings()
        with transaction() as session:
            failed = note_ingest_failure(
                session,
                batch_id=batch_id,
                reason=type(error).__name__,
                max_attempts=settings.ingest_max_attempts,
                retry_seconds=settings.ingest_retry_seconds,
            )
        return lifecycle.FAILED if failed else lifecycle.VALIDATING


def _ingest(batch_id: str) -> str:
    settings = get_settings()
    with transaction() as session:
        status = ingest_batch(session, get_blob_store(), settings, batch_id=batch_id)
        batch = get_batch(session, tenant_id=None, batch_id=batch_id)
        enqueued = batch.request_total if status == lifecycle.IN_PROGRESS else 0
        if enqueued:  # each model the batch queued work for (a batch whose lines name their models may mix them)
            for model in queued_models(session, batch_id=batch_id):
                wake_after_commit(session, "batch.run", model=model)
            if batch_done(session, batch_id=batch_id):  # every request already ended (unserved models)
                wake_after_commit(session, "batch.finalize", batch_id=batch_id)
    if enqueued >= ANALYZE_AFTER_ROWS:
        with transaction() as session:
            refresh_statistics(session)
    return status


ANALYZE_AFTER_ROWS = 5000


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
    with transaction() as session:  # its own transaction: object deletes never hold the reaper's batch locks
        sweep_expired_files(session, get_blob_store(), limit=get_settings().retention_sweep_max_files)
    with transaction() as session:  # abandoned Uploads expire after their hour; their parts are aborted
        sweep_uploads(session, get_blob_store(), limit=get_settings().retention_sweep_max_files)
    archive_once()
    return result


def archive_once() -> int:
    """Archive batches past their protocol's results retention, then remove their objects; return how many objects."""
    keys: list[str] = []
    for protocol in PROTOCOLS.values():
        retention = protocol.results_retention(get_settings())
        if retention is not None:
            with transaction() as session:
                keys += archive_due(session, protocol=protocol, retention_seconds=retention)
    blobs = get_blob_store()
    for key in keys:  # after commit: a failed delete leaves an orphan object, never a batch without results
        blobs.delete(key)
    return len(keys)


def pending_ingest(session: Session) -> list[str]:
    """Batches still waiting for validation."""
    return batches_validating(session)
