"""Spend caps: a batch's `max_cost_usd` and a tenant's budget per calendar month (UTC).

Spend is what the tenant is billed (`billed_usd`: list price less the window's discount) for completed
requests, by the one pricing function (`price_job`); a month's spend counts requests that finished in it,
as `/v1/organization/costs` does. The check runs where results are recorded (`storage.queue.results.record`),
in the transaction that stores them: once a batch's billed cost reaches its cap, or its tenant's month is
spent, the batch's *queued* requests end as `budget_exceeded` error lines (the way cancel closes them) and
nothing of it is claimed again. Requests already running finish and are billed. A batch's cap is also held at
claim time (storage/queue/claim_caps.py): its requests are leased only while its spend plus what its requests
in flight may cost is under the cap, so it ends at most one request past it; a tenant's month is not reserved
at claim, and its stop overruns the budget by at most the requests in flight when it was reached. Money is
Decimal; the database keeps exact integer micro-dollars.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from storage import lifecycle
from storage.adapters.registry import adapter_bases
from storage.clock import now
from storage.errors import BudgetExceeded, InvalidValue
from storage.files.blobs import BlobStore
from storage.finance.prices import price_book, price_job
from storage.models import Batch, BatchRequest, Tenant
from storage.planning.shapes import shape_of_jsonl
from storage.settings import Settings
from storage.strict import parse_usd as parse_usd  # the one money parser lives in storage/strict.py
from storage.tenants import find_tenant

BUDGET_CODE = "budget_exceeded"
MICRO = Decimal("0.000001")
_PER_USD = 1_000_000


def usd(micro: int) -> Decimal:
    """Micro-dollars as a Decimal amount of dollars."""
    return Decimal(micro) / _PER_USD


def usd_text(amount: Decimal) -> str:
    """Dollars as the API writes them: a decimal string with 6 places."""
    return str(amount.quantize(MICRO))


def month_start(at: int) -> int:
    """00:00 UTC of the first day of the calendar month holding `at` (unix seconds)."""
    day = datetime.fromtimestamp(at, tz=UTC)
    return int(datetime(day.year, day.month, 1, tzinfo=UTC).timestamp())


def _billed(settings: Settings, rows: Iterable[Any]) -> Decimal:
    """Sum of billed USD over (model, window, created_at, input, output, cached) rows."""
    book = price_book(settings)
    total = Decimal(0)
    for model, window, created, i, o, c in rows:
        block = price_job(
            book,
            model=model,
            created_at=created,
            completion_window=window,
            input_tokens=int(i or 0),
            output_tokens=int(o or 0),
            busy_seconds=Decimal(0),
            cached_input_tokens=int(c or 0),
        )
        total += block.billed_usd
    return total


_TOKENS = (
    func.sum(BatchRequest.prompt_tokens),
    func.sum(BatchRequest.completion_tokens),
    func.sum(BatchRequest.cached_tokens),
)


def batch_spend(session: Session, settings: Settings, *, batch: Batch) -> Decimal:
    """What the batch has been billed so far (its completed requests)."""
    rows = session.execute(
        select(BatchRequest.model, *_TOKENS)
        .where(BatchRequest.batch_id == batch.id, BatchRequest.status == lifecycle.REQ_COMPLETED)
        .group_by(BatchRequest.model)
    ).all()
    return _billed(settings, ((m, batch.completion_window, batch.created_at, i, o, c) for m, i, o, c in rows))


def month_spend(session: Session, settings: Settings, *, tenant_id: str, at: int | None = None) -> Decimal:
    """What the tenant has been billed this calendar month (UTC): completed requests that finished in it."""
    return month_spends(session, settings, tenant_id=tenant_id, at=at).get(tenant_id, Decimal(0))


def month_spends(
    session: Session, settings: Settings, *, tenant_id: str | None = None, at: int | None = None
) -> dict[str, Decimal]:
    """{tenant_id: billed this calendar month (UTC)} for every tenant that spent (or only `tenant_id`)."""
    start = month_start(now() if at is None else at)
    query = (
        select(BatchRequest.tenant_id, BatchRequest.model, Batch.completion_window, Batch.created_at, *_TOKENS)
        .join(Batch, Batch.id == BatchRequest.batch_id)
        .where(BatchRequest.status == lifecycle.REQ_COMPLETED, BatchRequest.finished_at >= start)
        .group_by(BatchRequest.tenant_id, BatchRequest.model, Batch.id, Batch.completion_window, Batch.created_at)
    )
    if tenant_id is not None:
        query = query.where(BatchRequest.tenant_id == tenant_id)
    by_tenant: dict[str, list[Any]] = {}
    for tenant, *row in session.execute(query).all():
        by_tenant.setdefault(tenant, []).append(row)
    return {tenant: _billed(settings, rows) for tenant, rows in by_tenant.items()}


@dataclass(frozen=True)
class TenantBudget:
    """A tenant's monthly budget (None: none set), what it spent this month, and what is left."""

    tenant_id: str
    budget_usd: Decimal | None
    spent_usd: Decimal
    month_start: int

    @property
    def remaining_usd(self) -> Decimal | None:
        """What is left this month (never below 0), or None without a budget."""
        return None if self.budget_usd is None else max(self.budget_usd - self.spent_usd, Decimal(0))

    def to_json(self) -> dict[str, Any]:
        """Decimal strings (6 places) and the month's start; the `budget` extension of the costs page."""
        left = self.remaining_usd
        return {
            "object": "organization.budget",
            "tenant_id": self.tenant_id,
            "currency": "usd",
            "month_start": self.month_start,
            "monthly_budget_usd": None if self.budget_usd is None else usd_text(self.budget_usd),
            "spent_usd": usd_text(self.spent_usd),
            "remaining_usd": None if left is None else usd_text(left),
        }


def tenant_budget(session: Session, settings: Settings, *, tenant_id: str) -> TenantBudget:
    """The tenant's budget, spend so far this month, and what is left."""
    micro = session.scalar(select(Tenant.monthly_budget_micro_usd).where(Tenant.id == tenant_id))
    return TenantBudget(
        tenant_id=tenant_id,
        budget_usd=None if micro is None else usd(micro),
        spent_usd=month_spend(session, settings, tenant_id=tenant_id),
        month_start=month_start(now()),
    )


def tenant_budgets(session: Session, settings: Settings) -> list[TenantBudget]:
    """Every tenant with a budget or with spend this month, with both (the admin's view; two queries)."""
    spends = month_spends(session, settings)
    rows = session.execute(
        select(Tenant.id, Tenant.monthly_budget_micro_usd)
        .where(Tenant.monthly_budget_micro_usd.is_not(None) | Tenant.id.in_(sorted(spends)))
        .order_by(Tenant.name)
    ).all()
    start = month_start(now())
    return [
        TenantBudget(
            tenant_id=tenant_id,
            budget_usd=None if micro is None else usd(micro),
            spent_usd=spends.get(tenant_id, Decimal(0)),
            month_start=start,
        )
        for tenant_id, micro in rows
    ]


def set_tenant_budget(session: Session, settings: Settings, *, tenant: str, usd_micro: int | None) -> TenantBudget:
    """Set (with None, remove) the monthly budget of the tenant named `tenant` (or with that id); running
    batches of a tenant now over it stop at their next recorded result."""
    row = session.get_one(Tenant, find_tenant(session, tenant=tenant))
    row.monthly_budget_micro_usd = usd_micro
    session.flush()
    return tenant_budget(session, settings, tenant_id=row.id)


def check_room_for(
    session: Session, settings: Settings, *, tenant_id: str, estimate_usd: Decimal
) -> TenantBudget | None:
    """Refuse (BudgetExceeded) a batch whose estimated billed cost is more than the tenant has left this month."""
    budget = tenant_budget(session, settings, tenant_id=tenant_id)
    left = budget.remaining_usd
    if left is None or estimate_usd <= left:
        return budget
    raise BudgetExceeded(
        f"This batch's estimated cost, ${usd_text(estimate_usd)}, is more than the ${usd_text(left)} left of "
        f"this tenant's monthly budget of ${usd_text(budget.budget_usd or Decimal(0))} "
        f"(${usd_text(budget.spent_usd)} spent this month). The estimate bills every request its full "
        "max_tokens; lower max_tokens, split the batch, or ask an admin for a larger budget.",
        param="input_file_id",
    )


def check_max_cost(micro: int | None, *, param: str = "max_cost_usd") -> int | None:
    """A batch's spend cap as given at create (None: no cap); a cap of $0 is refused (InvalidValue): it would run
    nothing, and a client that sends one most likely meant no cap or a small one."""
    if micro == 0:
        raise InvalidValue(
            f"{param} must be more than $0: a cap of 0 would run nothing. Leave it out for no cap.", param=param
        )
    return micro


def check_month_not_spent(session: Session, settings: Settings, *, tenant_id: str, what: str) -> None:
    """Refuse (BudgetExceeded) new work of a tenant whose monthly budget is spent (a retry: it is not estimated,
    and without this every retry of a stopped batch would run one more in-flight window past the budget)."""
    budget = tenant_budget(session, settings, tenant_id=tenant_id)
    if budget.budget_usd is None or budget.remaining_usd:
        return
    raise BudgetExceeded(
        f"This tenant's monthly budget of ${usd_text(budget.budget_usd)} is spent "
        f"(${usd_text(budget.spent_usd)} this month): {what} would run past it. Ask an admin for a larger budget.",
        param=None,
    )


def check_file_within_budget(
    session: Session,
    blobs: BlobStore,
    settings: Settings,
    *,
    tenant_id: str,
    blob_key: str,
    endpoint: str,
    model: str | None,
    completion_window: str,
) -> None:
    """Refuse (BudgetExceeded) an input file whose estimated billed cost is more than the tenant has left this
    month; a tenant without a budget is not estimated (the file is not read)."""
    budget = session.scalar(select(Tenant.monthly_budget_micro_usd).where(Tenant.id == tenant_id))
    if budget is None:
        return
    shape = shape_of_jsonl(  # judged as validation will: lines naming the tenant's adapters count
        blobs.open_stream(blob_key, chunk_bytes=settings.stream_chunk_bytes),
        endpoint=endpoint,
        max_line_bytes=settings.line_max_bytes,
        max_requests=settings.batch_max_requests,
        default_models=settings.default_models(),
        adapters=adapter_bases(session, settings, tenant_id=tenant_id),
        max_adapters=settings.batch_max_adapters,
    )
    estimate = price_job(
        price_book(settings),
        model=model,
        created_at=now(),
        completion_window=completion_window,
        input_tokens=shape.input_tokens,
        output_tokens=shape.output_tokens,
        busy_seconds=Decimal(0),
    ).billed_usd
    check_room_for(session, settings, tenant_id=tenant_id, estimate_usd=estimate)
