"""Admission: may a just-enqueued job stay (its tenant's quota), and can it and the jobs accepted before it finish
inside their windows? `admit` returns the verdict, with its message."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from sqlalchemy.orm import Session

from storage.clock import now_f
from storage.models import Batch
from storage.planning.shapes import work_of
from storage.planning.throughput import Throughput, throughput
from storage.queue.backlog import OpenJob, open_jobs, with_lora_work
from storage.settings import Settings
from storage.tenants import tenant_name

Problem = dict[str, Any]  # a batch-level entry of `errors.data` / `warnings.data`


def edf_finish_times(
    jobs: Iterable[OpenJob], *, work_per_second: float, prefill_weight: Decimal, at: float
) -> dict[str, float]:
    """When each job finishes if the node serves open work earliest deadline first at `work_per_second`.

    Jobs with the same deadline share the node (the queue's fair share), so all of them finish when the
    last of them does. This is the classic EDF test: the set is feasible iff every job finishes in time.
    """
    by_deadline: dict[int, list[OpenJob]] = {}
    for job in jobs:
        by_deadline.setdefault(job.deadline, []).append(job)
    finish: dict[str, float] = {}
    clock = at
    for deadline in sorted(by_deadline):
        group = by_deadline[deadline]
        clock += sum(work_of(job.shape, prefill_weight) for job in group) / work_per_second
        finish.update((job.batch_id, clock) for job in group)
    return finish


@dataclass(frozen=True)
class Admission:
    """Whether a just-enqueued job (and the jobs accepted before it) can finish inside their windows."""

    batch_id: str
    deadline_at: int
    finish_at: float
    throughput: Throughput
    newly_late: tuple[str, ...]  # accepted jobs on time without this one but late with it

    @property
    def fits(self) -> bool:
        """True if this job finishes in its window and pushes no other job past its deadline."""
        return self.finish_at <= self.deadline_at and not self.newly_late


def admission_check(
    session: Session,
    *,
    batch_id: str,
    model: str,
    settings: Settings,
    jobs: list[OpenJob] | None = None,
    at: float | None = None,
    rate: Throughput | None = None,
) -> Admission:
    """Project the model's open work (`jobs`, read if not given), this batch's rows included, earliest
    deadline first at the measured speed (or `rate`); adapter lines weigh their LoRA overhead
    (storage/planning/lora.py)."""
    at = now_f() if at is None else at
    rate = throughput(session, model=model, settings=settings) if rate is None else rate
    jobs = open_jobs(session, model=model) if jobs is None else jobs
    jobs = with_lora_work(session, settings, model=model, jobs=jobs)  # adapter lines' extra FLOPs (idempotent)

    def project(selected: Iterable[OpenJob]) -> dict[str, float]:
        return edf_finish_times(
            selected, work_per_second=rate.work_per_second, prefill_weight=settings.prefill_weight, at=at
        )

    with_job = project(jobs)
    without = project(job for job in jobs if job.batch_id != batch_id)
    deadlines = {job.batch_id: job.deadline for job in jobs}
    newly_late = tuple(sorted(b for b, t in without.items() if t <= deadlines[b] < with_job[b]))
    return Admission(batch_id, deadlines.get(batch_id, 0), with_job.get(batch_id, at), rate, newly_late)


@dataclass(frozen=True)
class Verdict:
    """Admission's answer for a job: a rejection (the batch fails with it), or warnings to keep on the batch."""

    rejection: Problem | None = None
    warnings: tuple[Problem, ...] = ()
    finish_at: float | None = None  # the predicted finish (the latest of its models'), kept on the batch


@dataclass(frozen=True)
class Judgement:
    """Admission's answer for one model of a job: a rejection or warnings, and the projection it came from."""

    rejection: Problem | None
    warnings: tuple[Problem, ...]
    check: Admission  # the projection: the job's predicted finish


def admit(session: Session, settings: Settings, *, batch: Batch, models: Iterable[str]) -> Verdict:
    """Judge a job whose rows are queued but not yet committed, model by model: the tenant's enqueued-token
    quota (`token_limit_exceeded`), then whether it and the jobs accepted before it finish inside their
    windows at the measured throughput (`admission_policy`: a `deadline_at_risk` warning, or
    `deadline_infeasible`)."""
    warnings: list[Problem] = []
    finish: list[float] = []
    for model in models:
        jobs = open_jobs(session, model=model)
        judged = judge(session, settings, batch_id=batch.id, tenant_id=batch.tenant_id, model=model, jobs=jobs)
        if judged.rejection is not None:
            return Verdict(judged.rejection)
        warnings += judged.warnings
        finish.append(judged.check.finish_at)
    return Verdict(None, tuple(warnings), max(finish, default=None))


def judge(
    session: Session,
    settings: Settings,
    *,
    batch_id: str,
    tenant_id: str | None,
    model: str,
    jobs: list[OpenJob],
    at: float | None = None,
    rate: Throughput | None = None,
    estimate: bool = False,
) -> Judgement:
    """Judge the job `batch_id` among the model's open `jobs` (its own included): the tenant's quota, then its
    projection against `admission_policy`. The projection is made whatever the policy: it is the job's predicted
    finish. `estimate`: the words of a dry run (storage/batches/window_menu.py), nothing was enqueued."""
    check = admission_check(session, batch_id=batch_id, model=model, settings=settings, jobs=jobs, at=at, rate=rate)
    limit = None if tenant_id is None else _token_limit(session, settings, tenant_id=tenant_id)
    if limit is not None:
        mine = [job for job in jobs if job.tenant_id == tenant_id]
        enqueued = sum(job.shape.input_tokens for job in mine)
        if enqueued > limit:
            added = sum(job.shape.input_tokens for job in mine if job.batch_id == batch_id)
            quota = _quota_problem(
                session, tenant_id or "", model=model, limit=limit, enqueued=enqueued - added, added=added
            )
            return Judgement(quota, (), check)
    if settings.admission_policy == "off" or check.fits:
        return Judgement(None, (), check)
    measured = check.throughput.source == "measured"
    if settings.admission_policy == "reject" and measured:
        return Judgement(
            _problem("deadline_infeasible", _deadline_message(check, rejected=True, estimate=estimate)), (), check
        )
    return Judgement(
        None, (_problem("deadline_at_risk", _deadline_message(check, rejected=False, estimate=estimate)),), check
    )


def _problem(code: str, message: str) -> Problem:
    """A batch-level entry in OpenAI's `errors.data` shape (no line: it concerns the whole job)."""
    return {"code": code, "message": message, "param": None, "line": None}


def _token_limit(session: Session, settings: Settings, *, tenant_id: str) -> int | None:
    """The tenant's enqueued-token limit per model: its override (by id or name), else the default."""
    overrides = settings.enqueued_token_limits
    if tenant_id in overrides:
        return overrides[tenant_id]
    name = tenant_name(session, tenant_id=tenant_id) if overrides else None
    if name is not None and name in overrides:
        return overrides[name]
    return settings.enqueued_token_limit


def _quota_problem(session: Session, tenant_id: str, *, model: str, limit: int, enqueued: int, added: int) -> Problem:
    name = tenant_name(session, tenant_id=tenant_id) or tenant_id
    message = (
        f"Enqueued token limit reached for {model} in organization {name}. Limit: {limit:,} enqueued "
        f"tokens; {enqueued:,} are already enqueued and this batch adds about {added:,}. Please try again "
        "once some in_progress batches have been completed, or submit a smaller batch."
    )
    return _problem("token_limit_exceeded", message)


def _deadline_message(check: Admission, *, rejected: bool, estimate: bool = False) -> str:
    rate = check.throughput
    speed = f"{rate.work_per_second:,.0f} tokens/s"
    basis = f"the measured {speed}" if rate.source == "measured" else f"an assumed {speed} (not measured yet)"
    parts = []
    if check.finish_at > check.deadline_at:
        parts.append(
            f"this batch is estimated to finish at {_utc(check.finish_at)}, after its completion window "
            f"closes at {_utc(check.deadline_at)}"
        )
    if check.newly_late:
        parts.append(f"it would push {len(check.newly_late)} accepted batches past their deadlines")
    if estimate:
        outcome = "It would not be enqueued." if rejected else "It would be accepted anyway; it may expire unfinished."
    else:
        outcome = (
            "The batch was not enqueued." if rejected else "The batch was accepted anyway; it may expire unfinished."
        )
    return f"At {basis} behind the current backlog, {' and '.join(parts)}. {outcome}"


def _utc(at: float) -> str:
    return datetime.fromtimestamp(at, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
