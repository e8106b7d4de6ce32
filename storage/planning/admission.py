"""Admission: can a just-enqueued job, and the jobs accepted before it, finish inside their windows?"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from decimal import Decimal

from sqlalchemy.orm import Session

from storage.clock import now_f
from storage.planning.shapes import work_of
from storage.planning.throughput import Throughput, throughput
from storage.queue.backlog import OpenJob, open_jobs
from storage.settings import Settings


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
) -> Admission:
    """Project the model's open work (`jobs`, read if not given), this batch's rows included, earliest
    deadline first at the measured speed."""
    at = now_f() if at is None else at
    rate = throughput(session, model=model, settings=settings)
    jobs = open_jobs(session, model=model) if jobs is None else jobs

    def project(selected: Iterable[OpenJob]) -> dict[str, float]:
        return edf_finish_times(
            selected, work_per_second=rate.work_per_second, prefill_weight=settings.prefill_weight, at=at
        )

    with_job = project(jobs)
    without = project(job for job in jobs if job.batch_id != batch_id)
    deadlines = {job.batch_id: job.deadline for job in jobs}
    newly_late = tuple(sorted(b for b, t in without.items() if t <= deadlines[b] < with_job[b]))
    return Admission(batch_id, deadlines.get(batch_id, 0), with_job.get(batch_id, at), rate, newly_late)
