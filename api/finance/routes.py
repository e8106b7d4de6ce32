"""Cost accounting over HTTP: a job's cost block, the finance reports, the roofline planner, the finance page."""

from __future__ import annotations

import dataclasses
from decimal import Decimal
from importlib import resources
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse

from api.deps import Caller, Config, DbSession
from api.finance import budgets
from api.finance import reports as organization
from api.pages import page_response
from storage.batches.batches import get_batch
from storage.errors import InvalidRequest
from storage.finance.job_cost import batch_cost_json
from storage.lines.reader import clip
from storage.planning.roofline import (
    BOUNDS,
    EXAMPLE_CONTEXT,
    EXAMPLE_HARDWARE,
    GB,
    HARDWARE_PRESETS,
    LLAMA_70B_FP8,
    ModelShape,
    plan,
)

router = APIRouter()
router.include_router(organization.router)
router.include_router(budgets.router)

# The worked example of shared/inference-economics.txt (storage/planning/roofline.py): Llama 3.1 70B in FP8.
EXAMPLE_WEIGHTS_GB = LLAMA_70B_FP8.weight_bytes / GB
EXAMPLE_KV_BYTES_PER_TOKEN = LLAMA_70B_FP8.kv_bytes_per_token


@router.get("/v1/batches/{batch_id}/cost", tags=["batches"], response_model=dict[str, Any])
def batch_cost(batch_id: str, session: DbSession, caller: Caller, settings: Config) -> dict[str, Any]:
    """Backfill extension: what the job was billed, its list price and discount, and its measured compute
    cost. `cost` is null until a request has completed."""
    batch = get_batch(session, tenant_id=caller.tenant_id, batch_id=batch_id)
    return {
        "object": "batch.cost",
        "batch_id": batch.id,
        "status": batch.status,
        "currency": "usd",
        "cost": batch_cost_json(session, batch, settings),
    }


def _query(name: str, **extra: Any) -> Any:
    """A numeric query parameter bounded as the planner bounds it: finite, `ge`/`le` in the schema."""
    bound = BOUNDS[name]
    return Query(ge=bound.low, le=bound.high, allow_inf_nan=False, **extra)


@router.get("/v1/planner", tags=["planner"], response_model=dict[str, Any])
def planner(
    caller: Caller,
    settings: Config,
    weights_gb: Annotated[float, _query("weights_gb")] = EXAMPLE_WEIGHTS_GB,
    kv_bytes_per_token: Annotated[float, _query("kv_bytes_per_token")] = EXAMPLE_KV_BYTES_PER_TOKEN,
    hardware: Annotated[str, Query(max_length=64)] = EXAMPLE_HARDWARE,
    gpus: Annotated[int | None, _query("gpus")] = None,
    gpu_hour_usd: Annotated[Decimal | None, _query("gpu_hour_usd")] = None,
    context: Annotated[int, _query("context")] = EXAMPLE_CONTEXT,
    batch_sizes: Annotated[str | None, Query(max_length=1024, description="Up to 64 comma-separated sizes.")] = None,
) -> dict[str, Any]:
    """The roofline: cost per 1M tokens and TPOT by batch size, and the prefill rate (compute-bound). Defaults
    to the worked example (Llama 3.1 70B FP8, 4,096-token context) on a node of this deployment's GPU count and
    price per GPU-hour."""
    if hardware not in HARDWARE_PRESETS:
        offered = ", ".join(HARDWARE_PRESETS)
        raise InvalidRequest(f"Unknown hardware {clip(hardware)}: use one of {offered}.", param="hardware")
    preset = HARDWARE_PRESETS[hardware]
    node = dataclasses.replace(
        preset,
        gpus=gpus or min(settings.gpu_count, int(BOUNDS["gpus"].high)),
        usd_per_gpu_hour=gpu_hour_usd if gpu_hour_usd is not None else settings.gpu_hour_usd,
    )
    shape = ModelShape(weight_bytes=weights_gb * GB, kv_bytes_per_token=kv_bytes_per_token)
    return {"object": "planner.plan", **plan(shape, node, context, _sizes(batch_sizes)).to_dict()}


def _sizes(text: str | None) -> list[int] | None:
    if text is None:
        return None
    bound = BOUNDS["batch_size"]
    try:
        sizes = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        sizes = []
    if not sizes or len(sizes) > 64 or not all(bound.low <= size <= bound.high for size in sizes):
        message = f"batch_sizes must be 1 to 64 comma-separated integers from 1 to {bound.high:,.0f}."
        raise InvalidRequest(message, param="batch_sizes")
    return sizes


@router.get("/finance", include_in_schema=False)
def finance_page(request: Request) -> HTMLResponse:
    """The finance page: a static shell that asks for an API key and calls the JSON endpoints."""
    if {"key", "api_key"} & set(request.query_params):
        raise InvalidRequest(
            "Never put an API key in a URL: servers and proxies log URLs. Open /finance and enter the key, "
            "or pass it in the fragment (/finance#key=...), which the browser never sends.",
            param="key",
        )
    page = resources.files("api.finance").joinpath("static/finance.html").read_text(encoding="utf-8")
    return page_response(page)
