"""Spend stops: a batch whose spend reached its `max_cost_usd`, or whose tenant's month is spent, has its queued
requests ended as `budget_exceeded` error lines (the way cancel closes them) and nothing of it is claimed again.

The rule and the spend it reads are storage/finance/budgets.py's; the queue applies it where results are
recorded (storage/queue/results.py `record`) and at claim (storage/queue/claim_caps.py), since only the queue
ends requests.
"""

from __future__ import annotations

from collections.abc import Iterable

from sqlalchemy import select
from sqlalchemy.orm import Session

from storage import lifecycle
from storage.finance.budgets import BUDGET_CODE, batch_spend, month_spend, usd, usd_text
from storage.models import Batch, Tenant
from storage.queue.batch_rows import end_queued
from storage.settings import Settings


def stop_over_budget(session: Session, settings: Settings, *, batch_ids: Iterable[str]) -> dict[str, int]:
    """End the queued requests of these batches (and of their tenants' other running batches) whose cap is
    reached or whose tenant's month is spent; return {batch_id: requests ended}. Cheap without caps."""
    wanted = sorted(set(batch_ids))
    if not wanted:
        return {}
    capped = session.execute(
        select(Batch, Tenant.monthly_budget_micro_usd)
        .join(Tenant, Tenant.id == Batch.tenant_id)
        .where(Batch.id.in_(wanted))
        .where(Batch.max_cost_micro_usd.is_not(None) | Tenant.monthly_budget_micro_usd.is_not(None))
    ).all()
    ended: dict[str, int] = {}
    spent_tenants: set[str] = set()
    for batch, tenant_micro in capped:
        if batch.max_cost_micro_usd is not None and batch_spend(session, settings, batch=batch) >= usd(
            batch.max_cost_micro_usd
        ):
            ended[batch.id] = stop_at_cap(session, batch)
        if tenant_micro is not None and batch.tenant_id not in spent_tenants:
            spent = month_spend(session, settings, tenant_id=batch.tenant_id) >= usd(tenant_micro)
            spent_tenants |= {batch.tenant_id} if spent else set()
    for tenant_id in sorted(spent_tenants):
        micro = session.scalar(select(Tenant.monthly_budget_micro_usd).where(Tenant.id == tenant_id)) or 0
        for batch in _running_batches(session, tenant_id=tenant_id, locked=set(wanted)):
            count = _stop(session, batch, f"its tenant's monthly budget of ${usd_text(usd(micro))}")
            if count:
                ended[batch.id] = ended.get(batch.id, 0) + count
    return {batch_id: count for batch_id, count in ended.items() if count}


def _running_batches(session: Session, *, tenant_id: str, locked: set[str]) -> list[Batch]:
    """The tenant's in-progress batches: those already locked by the caller, and the others it can lock now.

    Others are taken with SKIP LOCKED: a batch another transaction holds (its worker recording results) is
    stopped by that worker's own check, so two workers never wait on each other here."""
    query = select(Batch).where(Batch.tenant_id == tenant_id, Batch.status == lifecycle.IN_PROGRESS)
    mine = list(session.scalars(query.where(Batch.id.in_(sorted(locked)))))
    others = session.scalars(
        query.where(Batch.id.not_in(sorted(locked))).order_by(Batch.id).with_for_update(skip_locked=True)
    )
    return mine + list(others)


def stop_at_cap(session: Session, batch: Batch) -> int:
    """End the queued requests of a batch (locked by the caller) whose spend reached its `max_cost_usd`."""
    return _stop(session, batch, f"its max_cost_usd of ${usd_text(usd(batch.max_cost_micro_usd or 0))}")


def _stop(session: Session, batch: Batch, reason: str) -> int:
    """End the batch's queued requests as `budget_exceeded` lines and say why on the batch; return how many."""
    count = end_queued(
        session,
        batch=batch,
        code=BUDGET_CODE,
        message=f"This request was not run: the batch reached {reason}.",
    )
    if count and not any((w or {}).get("code") == BUDGET_CODE for w in batch.warnings or []):
        note = {"code": BUDGET_CODE, "message": f"The batch stopped at {reason}.", "param": None, "line": None}
        batch.warnings = [*(batch.warnings or []), note]
        session.flush()
    return count
