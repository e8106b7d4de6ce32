"""Backfill extension: tenants' monthly budgets, set by an admin and read by every tenant for itself."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query
from pydantic import BaseModel, ConfigDict, Field

from api.deps import Caller, Config, DbSession
from api.errors import error_responses
from storage.errors import PermissionDenied
from storage.finance.budgets import set_tenant_budget, tenant_budget
from storage.strict import UsdAmount, micro_usd
from storage.tenants import find_tenant, tenant_name

router = APIRouter(prefix="/v1/organization", tags=["organization"], responses=error_responses(403, 404))


class BudgetSet(BaseModel):
    """The body of `POST /v1/organization/budgets`."""

    model_config = ConfigDict(extra="forbid")

    tenant: str = Field(min_length=1, max_length=200, description="The tenant's name (or id).")
    monthly_budget_usd: UsdAmount | None = Field(
        description="US dollars per calendar month (UTC) as a decimal string (storage/strict.py); null removes it."
    )


@router.post("/budgets", response_model=dict[str, Any])
def set_budget(body: BudgetSet, session: DbSession, caller: Caller, settings: Config) -> dict[str, Any]:
    """Backfill extension (admin keys only): set a tenant's budget per calendar month. A batch whose estimate
    is more than what is left is refused at create (400 `budget_exceeded`); once the month's spend reaches the
    budget, the tenant's running batches stop claiming and their unrun requests end as `budget_exceeded` lines."""
    if not caller.is_admin:
        raise PermissionDenied("Only admin keys may set budgets.", param="tenant")
    micro = None if body.monthly_budget_usd is None else micro_usd(body.monthly_budget_usd)
    return set_tenant_budget(session, settings, tenant=body.tenant, usd_micro=micro).to_json()


@router.get("/budgets", response_model=dict[str, Any])
def read_budget(
    session: DbSession,
    caller: Caller,
    settings: Config,
    tenant_id: Annotated[
        str | None, Query(min_length=1, max_length=200, description="Admin keys only: another tenant's name or id.")
    ] = None,
) -> dict[str, Any]:
    """Backfill extension: the caller's tenant's monthly budget, what it spent this month, and what is left.
    `tenant_id` names a tenant by name or id, as `POST` does (404 `tenant_not_found` for an unknown one)."""
    wanted = caller.tenant_id
    if tenant_id is not None and tenant_id not in (caller.tenant_id, tenant_name(session, tenant_id=caller.tenant_id)):
        if not caller.is_admin:  # checked first: a tenant learns nothing of which other tenants exist
            raise PermissionDenied("Only admin keys may read another tenant's budget.", param="tenant_id")
        wanted = find_tenant(session, tenant=tenant_id, param="tenant_id")
    return tenant_budget(session, settings, tenant_id=wanted).to_json()
