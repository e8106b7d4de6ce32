"""Backfill extension: tenants' monthly budgets, set by an admin and read by every tenant for itself."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query
from pydantic import BaseModel, ConfigDict, Field

from api.deps import Caller, Config, DbSession
from api.errors import error_responses
from storage.errors import PermissionDenied
from storage.finance.budgets import parse_usd, set_tenant_budget, tenant_budget

router = APIRouter(prefix="/v1/organization", tags=["organization"], responses=error_responses(403))


class BudgetSet(BaseModel):
    """The body of `POST /v1/organization/budgets`."""

    model_config = ConfigDict(extra="forbid")

    tenant: str = Field(min_length=1, max_length=200, description="The tenant's name (or id).")
    monthly_budget_usd: str | None = Field(
        max_length=32, description="US dollars per calendar month (UTC) as a decimal string; null removes it."
    )


@router.post("/budgets", response_model=dict[str, Any])
def set_budget(body: BudgetSet, session: DbSession, caller: Caller, settings: Config) -> dict[str, Any]:
    """Backfill extension (admin keys only): set a tenant's budget per calendar month. A batch whose estimate
    is more than what is left is refused at create (400 `budget_exceeded`); once the month's spend reaches the
    budget, the tenant's running batches stop claiming and their unrun requests end as `budget_exceeded` lines."""
    if not caller.is_admin:
        raise PermissionDenied("Only admin keys may set budgets.", param="tenant")
    micro = None if body.monthly_budget_usd is None else parse_usd(body.monthly_budget_usd, param="monthly_budget_usd")
    return set_tenant_budget(session, settings, tenant=body.tenant, usd_micro=micro).to_json()


@router.get("/budgets", response_model=dict[str, Any])
def read_budget(
    session: DbSession,
    caller: Caller,
    settings: Config,
    tenant_id: Annotated[str | None, Query(max_length=128, description="Admin keys only: another tenant.")] = None,
) -> dict[str, Any]:
    """Backfill extension: the caller's tenant's monthly budget, what it spent this month, and what is left."""
    if tenant_id is not None and tenant_id != caller.tenant_id and not caller.is_admin:
        raise PermissionDenied("Only admin keys may read another tenant's budget.", param="tenant_id")
    return tenant_budget(session, settings, tenant_id=tenant_id or caller.tenant_id).to_json()
