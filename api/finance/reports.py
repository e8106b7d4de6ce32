"""Finance reports in the shape of OpenAI's admin API: daily costs and usage (JSON or CSV), and goodput."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query
from fastapi.responses import JSONResponse, Response

from api.deps import Caller, Config, DbSession
from api.errors import error_responses
from storage.clock import now
from storage.errors import InvalidRequest, PermissionDenied
from storage.finance.budgets import tenant_budget
from storage.finance.goodput import goodput_report
from storage.finance.reports import Bucket, check_window, cost_report, page_json, parse_group_by, to_csv, usage_report
from storage.tenants import Principal

router = APIRouter(prefix="/v1/organization", tags=["organization"], responses=error_responses(403))

LAST_SECOND = 253402300799  # 9999-12-31T23:59:59Z: every window fits a 64-bit column and a calendar
StartTime = Annotated[int, Query(ge=0, le=LAST_SECOND, description="Start of the window, unix seconds (inclusive).")]
EndTime = Annotated[
    int | None,
    Query(ge=1, le=LAST_SECOND + 1, description="End of the window, unix seconds (exclusive); default now."),
]
BucketWidth = Annotated[str, Query(max_length=16, description="Bucket width; only '1d' (UTC days) is supported.")]
GroupBy = Annotated[
    list[str] | None,
    Query(max_length=8, description="Repeat or comma-separate: tenant, model, completion_window, protocol."),
]
TenantFilter = Annotated[str | None, Query(max_length=128, description="Admin keys only: one tenant's rows.")]
Format = Annotated[str, Query(alias="format", max_length=16, description="'json' (default) or 'csv'.")]


def _scope(caller: Principal, tenant_id: str | None) -> str | None:
    """Admin keys read every tenant (or the one asked for); other keys read only their own."""
    if caller.is_admin:
        return tenant_id
    if tenant_id is not None and tenant_id != caller.tenant_id:
        raise PermissionDenied("Only admin keys may read another tenant's reports.", param="tenant_id")
    return caller.tenant_id


def _render(buckets: list[Bucket], *, kind: str, fmt: str, group_by: tuple[str, ...], window: str) -> Response:
    if fmt == "csv":
        return Response(
            to_csv(buckets, kind=kind, group_by=group_by),
            media_type="text/csv; charset=utf-8",
            headers={"Content-Disposition": f'attachment; filename="{kind}_{window}.csv"'},
        )
    return JSONResponse(page_json(buckets))


def _window(start_time: int, end_time: int | None, bucket_width: str, fmt: str) -> tuple[int, int]:
    if fmt not in ("json", "csv"):
        raise InvalidRequest(f"Invalid format '{fmt}': use 'json' or 'csv'.", param="format")
    end = end_time if end_time is not None else now() + 1
    check_window(start_time=start_time, end_time=end, bucket_width=bucket_width)
    return start_time, end


@router.get("/costs", response_model=dict[str, Any])
def costs(
    session: DbSession,
    caller: Caller,
    settings: Config,
    start_time: StartTime,
    end_time: EndTime = None,
    bucket_width: BucketWidth = "1d",
    group_by: GroupBy = None,
    tenant_id: TenantFilter = None,
    fmt: Format = "json",
) -> Response:
    """Daily costs of completed requests by the UTC day they finished: list price, discount, billed
    (`amount`), measured compute cost and margin. Scoped to one tenant, the JSON page also carries `budget`
    (a Backfill extension): its monthly budget, spend this calendar month and what is left."""
    start, end = _window(start_time, end_time, bucket_width, fmt)
    groups = parse_group_by(group_by)
    buckets = cost_report(
        session,
        settings=settings,
        start_time=start,
        end_time=end,
        tenant_id=_scope(caller, tenant_id),
        group_by=groups,
    )
    scope = _scope(caller, tenant_id)
    if fmt == "json" and scope is not None:  # Backfill extension: the tenant's month against its budget
        return JSONResponse(
            {**page_json(buckets), "budget": tenant_budget(session, settings, tenant_id=scope).to_json()}
        )
    return _render(buckets, kind="costs", fmt=fmt, group_by=groups, window=f"{start}_{end}")


@router.get("/usage", response_model=dict[str, Any])
def usage(
    session: DbSession,
    caller: Caller,
    start_time: StartTime,
    end_time: EndTime = None,
    bucket_width: BucketWidth = "1d",
    group_by: GroupBy = None,
    tenant_id: TenantFilter = None,
    fmt: Format = "json",
) -> Response:
    """Daily tokens and request counts by the UTC day requests finished; failed, expired and cancelled
    requests count in `num_failed_requests`."""
    start, end = _window(start_time, end_time, bucket_width, fmt)
    groups = parse_group_by(group_by)
    buckets = usage_report(
        session, start_time=start, end_time=end, tenant_id=_scope(caller, tenant_id), group_by=groups
    )
    return _render(buckets, kind="usage", fmt=fmt, group_by=groups, window=f"{start}_{end}")


@router.get("/goodput", response_model=dict[str, Any])
def goodput(
    session: DbSession,
    caller: Caller,
    start_time: StartTime,
    end_time: EndTime = None,
    bucket_width: BucketWidth = "1d",
    group_by: GroupBy = None,
    tenant_id: TenantFilter = None,
) -> Response:
    """Backfill extension: daily goodput, requests completed before their deadline / requests accepted, by
    the UTC day of the deadline, with what became of the rest (completed late, failed, expired, cancelled,
    still open)."""
    start, end = _window(start_time, end_time, bucket_width, "json")
    groups = parse_group_by(group_by)
    buckets = goodput_report(
        session, start_time=start, end_time=end, tenant_id=_scope(caller, tenant_id), group_by=groups
    )
    return JSONResponse(page_json(buckets))
