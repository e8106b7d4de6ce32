"""A price for every deadline (issue 40 §3): for each completion window the server offers, when a job would finish,
what it would cost, and whether admission would take it.

Nothing here predicts on its own: each window's finish is admission's projection (storage/batches/admission.py
`judge`: the model's open jobs served earliest deadline first at the measured rate) with the job added at that
window's deadline, and its verdict is the one ingest would give: the tenant's quota, then `admission_policy`. A
shorter window is served ahead of every job due later, so it finishes sooner; the background tier is served
after all of them. Each price is the one pricing function's (`price_job`) at the window's discount.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from sqlalchemy.orm import Session

from storage.batches.admission import Problem, judge
from storage.finance.prices import CostBlock, price_book, price_job, usd_text
from storage.planning.shapes import JobShape
from storage.planning.throughput import Throughput
from storage.queue.backlog import OpenJob, open_jobs
from storage.settings import Settings
from storage.windows import by_length, deadline_for, is_background_window

# The id the job under estimate goes by among the open jobs: no batch id has this shape (storage/ids.py).
CANDIDATE = "estimate"


@dataclass(frozen=True)
class WindowOption:
    """One entry of the menu: a window, its deadline, the predicted finish, the price, admission's verdict."""

    window: str
    deadline_at: int | None  # None: the background tier has no deadline
    finish_at: float
    cost: CostBlock
    admitted: bool
    problem: Problem | None  # why not admitted (`admitted` false), or the risk it was admitted with

    @property
    def fits_window(self) -> bool:
        """True if the job is predicted to finish before this window closes."""
        return self.deadline_at is None or self.finish_at <= self.deadline_at

    def to_json(self) -> dict[str, Any]:
        """JSON-ready: times as whole unix seconds, money as Decimal strings (USD to 6 places)."""
        cost = self.cost
        return {
            "completion_window": self.window,
            "deadline_at": self.deadline_at,
            "finish_at": int(self.finish_at),
            "fits_window": self.fits_window,
            "price": {
                "list_usd": usd_text(cost.list_usd),
                "discount_pct": str(cost.discount_pct.quantize(Decimal("0.01"))),
                "discount_usd": usd_text(cost.discount_usd),
                "billed_usd": usd_text(cost.billed_usd),
            },
            "admitted": self.admitted,
            "reason": None if self.admitted else self.problem,
            "warning": self.problem if self.admitted else None,
        }


def window_menu(
    session: Session,
    settings: Settings,
    *,
    model: str,
    shape: JobShape,
    rate: Throughput,
    at: float,
    job_seconds: float,
    tenant_id: str | None = None,
) -> tuple[WindowOption, ...]:
    """Every offered window for a job of `shape` submitted at `at`, shortest first, the background tier last.

    `tenant_id`: whose quota applies (None: none, as for the server's own `backfill estimate`)."""
    jobs = [job for job in open_jobs(session, model=model) if job.batch_id != CANDIDATE]
    book = price_book(settings)
    menu = []
    for window in by_length(settings.completion_windows):
        deadline = deadline_for(window, created_at=int(at))
        candidate = OpenJob(CANDIDATE, tenant_id or "", deadline, shape)
        judged = judge(
            session,
            settings,
            batch_id=CANDIDATE,
            tenant_id=tenant_id,
            model=model,
            jobs=[*jobs, candidate],
            at=at,
            rate=rate,
            estimate=True,
        )
        cost = price_job(
            book,
            model=model,
            created_at=at,
            completion_window=window,
            input_tokens=shape.input_tokens,
            output_tokens=shape.output_tokens,
            busy_seconds=Decimal(repr(job_seconds)),
        )
        problem = judged.rejection or (judged.warnings[0] if judged.warnings else None)
        menu.append(
            WindowOption(
                window=window,
                deadline_at=None if is_background_window(window) else deadline,
                finish_at=judged.check.finish_at,
                cost=cost,
                admitted=judged.rejection is None,
                problem=problem,
            )
        )
    return tuple(menu)
