"""The web console (`/console`): one page for tenants and finance, and the few reads it needs beyond the public API.

The page is a static shell assembled from `static/` (markup, style, the app, the batch controls in their own
script so the batch-control routes can be wired there alone, and a batch's workflow: trial, checks, attempts); it
holds the API key in sessionStorage and sends it as a header. The `/v1/console/...` reads are Backfill extensions
scoped like every other route.
"""

from __future__ import annotations

import functools
from importlib import resources
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse

from api.deps import Caller, Config, Cursor, DbSession
from api.errors import error_responses
from api.openai.batch_retries import lines_path
from api.pages import page_response
from storage.batches.batches import get_batch, search_batches
from storage.batches.finish_predictions import finish_errors
from storage.batches.retries import retry_ids_of
from storage.batches.retry_counts import retry_counts
from storage.batches.trials import trial_json
from storage.clock import now_f
from storage.errors import InvalidRequest, PermissionDenied
from storage.finance.budgets import tenant_budgets, usd, usd_text
from storage.finance.job_cost import batch_cost_json
from storage.metrics.events import ENGINE_BUSY_SECONDS
from storage.metrics.queue_state import QUEUE_STATE
from storage.models import Batch
from storage.protocols import OPENAI, protocol_of
from storage.queue.failures import failures_by_code
from storage.tenants import tenant_name, tenant_names
from storage.windows import is_background_window

router = APIRouter(prefix="/v1/console", tags=["console"])
page_router = APIRouter()

STATUSES = ("validating", "in_progress", "finalizing", "completed", "failed", "expired", "cancelling", "cancelled")
Status = Annotated[str | None, Query(max_length=16, description="Only batches in this status.")]
Search = Annotated[str | None, Query(max_length=128, description="Part of a batch id or of its metadata.")]
FINISH_ERRORS_SECONDS = 7 * 86400  # the operations page's predicted-against-actual chart: the last week's batches


@functools.lru_cache(maxsize=1)
def console_html() -> str:
    """The page with its style and scripts inlined, so the policy can pin each block by its hash."""
    static = resources.files("api.console").joinpath("static")
    page = static.joinpath("console.html").read_text(encoding="utf-8")
    for name in ("console.css", "controls.js", "workflow.js", "console.js"):
        page = page.replace(f"/*{name}*/", static.joinpath(name).read_text(encoding="utf-8").strip())
    return page


@page_router.get("/console", include_in_schema=False)
def console_page(request: Request) -> HTMLResponse:
    """The console: a static shell that asks for an API key and calls the JSON endpoints."""
    if {"key", "api_key"} & {name.lower() for name in request.query_params}:
        raise InvalidRequest(
            "Never put an API key in a URL: servers and proxies log URLs. Open /console and enter the key.",
            param="key",
        )
    return page_response(console_html())


def _row(batch: Batch, cost: dict[str, Any] | None, *, tenants: dict[str, str] | None = None) -> dict[str, Any]:
    """A batch as the console shows it; with `tenants` (an admin key's list of every tenant's), its tenant."""
    protocol = protocol_of(batch)
    shown = {
        "id": batch.id,
        "protocol": batch.protocol,
        # Where the console reaches the batch, and what it calls its endpoint: the protocol says, not the console.
        "path": protocol.batch_path(batch.id),
        "results_path": protocol.results_path(batch.id),
        "lines_path": lines_path(batch.id),  # its result lines a page at a time (limit, after), whatever its protocol
        "endpoint": batch.endpoint,
        "endpoint_label": protocol.endpoint_label or batch.endpoint,
        "model": batch.model,
        "status": batch.status,
        "completion_window": batch.completion_window,
        "created_at": batch.created_at,
        "expires_at": None if is_background_window(batch.completion_window) else batch.expires_at,  # no deadline
        "ended_at": batch.completed_at or batch.failed_at or batch.expired_at or batch.cancelled_at,
        "metadata": batch.metadata_ or {},
        "request_counts": {
            "total": batch.request_total,
            "completed": batch.request_completed,
            "failed": batch.request_failed,
        },
        "cost": cost,
        "priority": batch.priority,
        "paused_at": batch.paused_at,
        "max_cost_usd": None if batch.max_cost_micro_usd is None else usd_text(usd(batch.max_cost_micro_usd)),
        "retry_of": batch.retry_of,
    }
    if tenants is not None:
        shown["tenant"] = tenants.get(batch.tenant_id, batch.tenant_id)
    return shown


@router.get("/whoami", response_model=dict[str, Any])
def whoami(session: DbSession, caller: Caller, settings: Config) -> dict[str, Any]:
    """Backfill extension: the console's sign-in check: the key's tenant, whether it is an admin key, and what a
    batch may ask for here (endpoints, completion windows with their discounts)."""
    return {
        "object": "console.session",
        "tenant": tenant_name(session, tenant_id=caller.tenant_id),
        "is_admin": caller.is_admin,
        "endpoints": list(OPENAI.endpoints),
        "completion_windows": {name: str(rate) for name, rate in sorted(settings.completion_windows.items())},
    }


@router.get("/batches", response_model=dict[str, Any])
def batches(
    session: DbSession,
    caller: Caller,
    settings: Config,
    status: Status = None,
    q: Search = None,
    after: Cursor = None,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
) -> dict[str, Any]:
    """Backfill extension: the caller's batches of both protocols newest first, with progress and cost. An
    admin key lists every tenant's, each with its `tenant` (this list only: every other read stays scoped)."""
    if status is not None and status not in STATUSES:
        raise InvalidRequest(f"Unknown status: use one of {', '.join(STATUSES)}.", param="status")
    scope = None if caller.is_admin else caller.tenant_id
    rows = search_batches(session, tenant_id=scope, status=status, query=q, after=after, limit=limit)
    names = tenant_names(session) if caller.is_admin else None
    page = [_row(row, batch_cost_json(session, row, settings), tenants=names) for row in rows[:limit]]
    return {"object": "list", "data": page, "has_more": len(rows) > limit, "last_id": page[-1]["id"] if page else None}


@router.get("/batches/{batch_id}", response_model=dict[str, Any])
def batch(batch_id: str, session: DbSession, caller: Caller, settings: Config) -> dict[str, Any]:
    """Backfill extension: one batch of either protocol with its files, validation errors, failed lines
    grouped by error code (line numbers and messages; `count` all, `lines` the first 50), its retries and
    what they did (`retried`: a retry still running, failed lines they completed, failed lines left), and its
    workflow: `trial` (with its report once run), `checks` and `on_expiry`."""
    row = get_batch(session, tenant_id=caller.tenant_id, batch_id=batch_id)
    return {
        **_row(row, batch_cost_json(session, row, settings)),
        "input_file_id": row.input_file_id,
        "output_file_id": row.output_file_id,
        "error_file_id": row.error_file_id,
        "has_manifest": row.manifest_key is not None,
        "errors": row.errors or [],
        "warnings": row.warnings or [],
        "failures": [group.to_json() for group in failures_by_code(session, batch_id=row.id)],
        "retries": retry_ids_of(session, batch_ids=[row.id])[row.id],
        "retried": retry_counts(session, batch=row).to_json(),
        # the workflow (docs/workflow.md): the trial with its status and report, the checks, what expiry does
        "trial": trial_json(row),
        "checks": row.checks,
        "on_expiry": row.on_expiry,
    }


@router.get("/budgets", response_model=dict[str, Any], responses=error_responses(403))
def budgets(session: DbSession, caller: Caller, settings: Config) -> dict[str, Any]:
    """Backfill extension, admin keys only: every tenant with a monthly budget or spend this month, with both
    (its own tenant's month is `GET /v1/organization/budgets`)."""
    if not caller.is_admin:
        raise PermissionDenied("Only admin keys may read every tenant's budget.")
    names = tenant_names(session)
    rows = [{**row.to_json(), "tenant": names.get(row.tenant_id)} for row in tenant_budgets(session, settings)]
    return {"object": "list", "data": rows}


@router.get("/overview", response_model=dict[str, Any], responses=error_responses(403))
def overview(session: DbSession, caller: Caller) -> dict[str, Any]:
    """Backfill extension, admin keys only: the operator's numbers of `/metrics` (queue depth by model and
    state, deadlines at risk, slack, goodput, engine busy seconds of this process), and how the predicted finishes
    of the batches that ended this week compare with their actual ones, per completion window (`finish_errors`)."""
    if not caller.is_admin:
        raise PermissionDenied("Only admin keys may read the operator overview.")
    snap = QUEUE_STATE.snapshot()
    models: dict[str, dict[str, Any]] = {}
    for (model, _tenant, state), count in snap.open.items():
        depth = models.setdefault(model, {"model": model, "open": {}})["open"]
        depth[state] = depth.get(state, 0) + count
    for model, deadline in snap.deadlines.items():
        entry = models.setdefault(model, {"model": model, "open": {}})
        entry.update(
            at_risk=deadline.at_risk,
            slack_seconds=deadline.slack_seconds,
            earliest_deadline=deadline.earliest_deadline,
            goodput=snap.goodput.get(model, {}).get("ratio"),
        )
    for metric in ENGINE_BUSY_SECONDS.collect():
        for sample in metric.samples:
            if sample.name.endswith("_total"):
                models.setdefault(sample.labels["model"], {"model": sample.labels["model"], "open": {}})[
                    "busy_seconds"
                ] = sample.value
    return {
        "object": "console.overview",
        "at": now_f(),
        "ok": snap.ok,
        "models": sorted(models.values(), key=lambda m: m["model"]),
        "finish_errors": [row.to_json() for row in finish_errors(session, since=int(now_f()) - FINISH_ERRORS_SECONDS)],
    }
