"""What is still open in the queue: per job, per model, and batches with nothing left to run.

Jobs are sized as ingest stored them (`est_input_tokens`, `max_output_tokens`): no body is parsed here.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from sqlalchemy import and_, func, or_, select
from sqlalchemy.orm import Session

from storage import lifecycle
from storage.adapters.registry import adapter_ranks
from storage.models import Batch, BatchRequest
from storage.planning.lora import adapter_factor
from storage.planning.shapes import JobShape, work, work_of
from storage.planning.throughput import throughput
from storage.settings import Settings


def open_count(session: Session, *, batch_id: str) -> int:
    """How many of the batch's requests are still queued or running."""
    return int(
        session.scalar(
            select(func.count())
            .select_from(BatchRequest)
            .where(BatchRequest.batch_id == batch_id, BatchRequest.status.in_(lifecycle.REQ_OPEN))
        )
        or 0
    )


def batch_done(session: Session, *, batch_id: str) -> bool:
    """Whether none of the batch's requests is still queued or running: the one test before finalize."""
    return open_count(session, batch_id=batch_id) == 0


def done_batches(session: Session, *, batch_ids: Iterable[str]) -> list[str]:
    """Those of `batch_ids` that are done (`batch_done`), in the order given: one statement for them all, which
    stops at a batch's first open request instead of counting them (a results commit asks after each flush)."""
    wanted = list(batch_ids)
    if not wanted:
        return []
    still_open = (
        select(BatchRequest.id)
        .where(BatchRequest.batch_id == Batch.id, BatchRequest.status.in_(lifecycle.REQ_OPEN))
        .exists()
    )
    done = set(session.scalars(select(Batch.id).where(Batch.id.in_(wanted), ~still_open)))
    return [batch_id for batch_id in wanted if batch_id in done]


def batches_ready_to_finalize(session: Session) -> list[str]:
    """Ids of running/cancelling batches with no open requests left (finalize picks them up)."""
    open_exists = (
        select(BatchRequest.id)
        .where(BatchRequest.batch_id == Batch.id, BatchRequest.status.in_(lifecycle.REQ_OPEN))
        .exists()
    )
    query = select(Batch.id).where(
        Batch.status.in_((lifecycle.IN_PROGRESS, lifecycle.CANCELLING, lifecycle.FINALIZING)), ~open_exists
    )
    return list(session.scalars(query))


def models_waiting_unserved(session: Session) -> list[str]:
    """Models with queued requests and none running: no live worker is feeding them (they need a wake-up)."""
    busy = select(BatchRequest.model).where(BatchRequest.status == lifecycle.REQ_RUNNING).distinct()
    return list(
        session.scalars(
            select(BatchRequest.model)
            .where(BatchRequest.status == lifecycle.REQ_QUEUED, BatchRequest.model.not_in(busy))
            .distinct()
        )
    )


def has_queued(session: Session, *, model: str) -> bool:
    """True if any request of `model` waits in the queue."""
    query = (
        select(BatchRequest.id).where(BatchRequest.model == model, BatchRequest.status == lifecycle.REQ_QUEUED).limit(1)
    )
    return session.scalar(query) is not None


@dataclass(frozen=True)
class OpenJob:
    """A job's unfinished (queued or running) requests: its deadline and the work they still ask for."""

    batch_id: str
    tenant_id: str
    deadline: int
    shape: JobShape


def open_jobs(session: Session, *, model: str, tenant_id: str | None = None) -> list[OpenJob]:
    """Each job's queued and running requests of the model (optionally one tenant's), as sized at ingest."""
    columns = (BatchRequest.batch_id, BatchRequest.tenant_id, BatchRequest.deadline)
    query = select(
        *columns, func.count(), func.sum(BatchRequest.est_input_tokens), func.sum(BatchRequest.max_output_tokens)
    ).where(BatchRequest.model == model, BatchRequest.status.in_(lifecycle.REQ_OPEN))
    if tenant_id is not None:
        query = query.where(BatchRequest.tenant_id == tenant_id)
    return [
        OpenJob(batch_id, tenant, int(deadline), JobShape(int(n), int(i or 0), int(o or 0), model))
        for batch_id, tenant, deadline, n, i, o in session.execute(query.group_by(*columns))
    ]


def with_lora_work(session: Session, settings: Settings, *, model: str, jobs: list[OpenJob]) -> list[OpenJob]:
    """`jobs` with the LoRA overhead of their open adapter lines (storage/planning/lora.py) in their work: each
    adapter's tokens weigh (factor - 1) more. Unchanged for a model that takes no adapters; a job with no rows in
    the queue (an estimate's candidate) keeps the overhead it was given (`shape_with_lora_work`)."""
    spec = settings.served_models().get(model)
    if spec is None or not spec.takes_adapters:
        return jobs
    extra = _lora_work(session, settings, base_path=spec.path, rows=_open_adapter_tokens(session, model=model))
    weighed = [(job, extra.get(job.batch_id, job.shape.lora_work)) for job in jobs]
    return [replace(job, shape=replace(job.shape, lora_work=lora)) for job, lora in weighed]


def shape_with_lora_work(session: Session, settings: Settings, *, model: str, shape: JobShape) -> JobShape:
    """A job not yet queued (a file sized by `shape_of_jsonl`) with its adapter lines' LoRA overhead, weighed as
    `with_lora_work` weighs queued ones: the estimate's work is the work admission will project."""
    spec = settings.served_models().get(model)
    if spec is None or not spec.takes_adapters or not shape.adapter_tokens:
        return shape
    rows = [("", adapter, input_tokens, output_tokens) for adapter, input_tokens, output_tokens in shape.adapter_tokens]
    return replace(shape, lora_work=_lora_work(session, settings, base_path=spec.path, rows=rows).get("", 0.0))


def _lora_work(
    session: Session, settings: Settings, *, base_path: str, rows: Sequence[tuple[str, str, int, int]]
) -> dict[str, float]:
    """key -> the LoRA overhead of its (key, adapter, input tokens, output tokens) rows, in output-token work; an
    adapter no longer registered adds nothing (its lines fail without running)."""
    ranks = adapter_ranks(session, settings, names={adapter for _, adapter, _, _ in rows})
    extra: dict[str, float] = {}
    for key, adapter, input_tokens, output_tokens in rows:
        if adapter not in ranks:
            continue
        rank, targets = ranks[adapter]
        factor = adapter_factor(base_path, rank=rank, targets=targets)
        done = work(output_tokens=output_tokens, input_tokens=input_tokens, prefill_weight=settings.prefill_weight)
        extra[key] = extra.get(key, 0.0) + (factor - 1.0) * done
    return extra


def backlog(session: Session, settings: Settings, *, model: str) -> JobShape:
    """Queued and running requests of the model, as sized at ingest: one sum, read off the queue index alone (it
    carries the sizes: storage/models/batches.py), not the rows; each worker reads it for its urgency horizon
    (storage/queue/claim_order.py). A model that takes adapters adds its adapter lines' LoRA overhead, as admission
    weighs them (a second sum, over those lines only)."""
    requests, input_tokens, output_tokens = session.execute(
        select(
            func.count(),
            func.coalesce(func.sum(BatchRequest.est_input_tokens), 0),
            func.coalesce(func.sum(BatchRequest.max_output_tokens), 0),
        ).where(BatchRequest.model == model, BatchRequest.status.in_(lifecycle.REQ_OPEN))
    ).one()
    shape = JobShape(int(requests), int(input_tokens), int(output_tokens), model)
    spec = settings.served_models().get(model)
    if spec is None or not spec.takes_adapters:
        return shape
    rows = [("", adapter, i, o) for _, adapter, i, o in _open_adapter_tokens(session, model=model)]  # one key
    return replace(shape, lora_work=_lora_work(session, settings, base_path=spec.path, rows=rows).get("", 0.0))


def _open_adapter_tokens(session: Session, *, model: str) -> list[tuple[str, str, int, int]]:
    """(batch id, adapter, input tokens, output tokens) of the model's open adapter lines, per batch and adapter."""
    tokens = session.execute(
        select(
            BatchRequest.batch_id,
            BatchRequest.adapter,
            func.sum(BatchRequest.est_input_tokens),
            func.sum(BatchRequest.max_output_tokens),
        )
        .where(
            BatchRequest.model == model,
            BatchRequest.adapter.is_not(None),
            BatchRequest.status.in_(lifecycle.REQ_OPEN),
        )
        .group_by(BatchRequest.batch_id, BatchRequest.adapter)
    ).all()
    return [(str(batch_id), str(adapter), int(i or 0), int(o or 0)) for batch_id, adapter, i, o in tokens]


def open_work_by_deadline(
    session: Session, *, models: Sequence[str], worker_id: str | None, at: float
) -> list[tuple[str, int, int, int, int]]:
    """(model, deadline, requests, max output tokens, est. input tokens) of queued requests (and those
    `worker_id` holds) per model and deadline, leaving out rows already past their deadline (the reaper's)."""
    mine = and_(BatchRequest.status == lifecycle.REQ_RUNNING, BatchRequest.lease_owner == worker_id)
    rows = session.execute(
        select(
            BatchRequest.model,
            BatchRequest.deadline,
            func.count(),
            func.sum(BatchRequest.max_output_tokens),
            func.sum(BatchRequest.est_input_tokens),
        )
        .where(
            BatchRequest.model.in_(models),
            BatchRequest.deadline > at,
            or_(BatchRequest.status == lifecycle.REQ_QUEUED, mine),
        )
        .group_by(BatchRequest.model, BatchRequest.deadline)
    ).all()
    return [(model, int(deadline), int(n), int(out or 0), int(inp or 0)) for model, deadline, n, out, inp in rows]


def drain_seconds(session: Session, *, model: str, settings: Settings, queued: JobShape | None = None) -> float:
    """Seconds the node needs to finish every open request of `model` (`queued`, if the caller has summed them) at
    its measured (or default) rate."""
    rate = throughput(session, model=model, settings=settings)
    open_work = backlog(session, settings, model=model) if queued is None else queued
    return work_of(open_work, settings.prefill_weight) / rate.work_per_second
