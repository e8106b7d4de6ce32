"""Plain factory functions for cost and usage tests: each adds one row and flushes."""

from __future__ import annotations

import json
from collections.abc import Collection
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from storage import lifecycle
from storage.ids import new_id
from storage.models import Batch, BatchRequest, EngineRun, Tenant
from storage.planning.shapes import request_size
from storage.tenants import get_or_create_tenant

DAY = 86400
# 2026-03-02 00:00 UTC: a fixed day so reports are deterministic.
DAY0 = 1772409600


def make_tenant(session: Session, name: str = "acme") -> Tenant:
    return get_or_create_tenant(session, name=name)


def make_batch(
    session: Session,
    *,
    tenant: Tenant,
    model: str = "fake-model",
    completion_window: str = "24h",
    created_at: int = DAY0,
    status: str = lifecycle.IN_PROGRESS,
) -> Batch:
    batch = Batch(
        id=new_id("batch_"),
        tenant_id=tenant.id,
        input_file_id=new_id("file-"),
        endpoint="/v1/chat/completions",
        completion_window=completion_window,
        model=model,
        status=status,
        created_at=created_at,
        expires_at=created_at + DAY,
        request_total=0,
        request_completed=0,
        request_failed=0,
    )
    session.add(batch)
    session.flush()
    return batch


def make_run(
    session: Session,
    *,
    busy_seconds: float,
    model: str = "fake-model",
    steps: int = 100,
    running_seq_steps: int = 800,
    started_at: float = DAY0 + 3600,
    **extra: Any,
) -> EngineRun:
    run = EngineRun(
        id=new_id("run_"),
        worker_id="test-worker",
        model=model,
        started_at=started_at,
        ended_at=started_at + busy_seconds,
        busy_seconds=busy_seconds,
        steps=steps,
        running_seq_steps=running_seq_steps,
        max_num_seqs=16,
        **extra,
    )
    session.add(run)
    session.flush()
    return run


_lines: dict[str, int] = {}


def make_request(
    session: Session,
    *,
    batch: Batch,
    run: EngineRun | None = None,
    status: str = lifecycle.REQ_COMPLETED,
    prompt_tokens: int = 0,
    completion_tokens: int = 0,
    finished_at: float | None = DAY0 + 7200,
    max_tokens: int | None = None,
) -> BatchRequest:
    line = _lines.get(batch.id, 0) + 1
    _lines[batch.id] = line
    body: dict[str, Any] = {"model": batch.model, "messages": [{"role": "user", "content": "hi"}]}
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    input_tokens, output_tokens = request_size("/v1/chat/completions", body, line_bytes=len(json.dumps(body)) + 60)
    request = BatchRequest(
        id=new_id("batch_req_"),
        batch_id=batch.id,
        tenant_id=batch.tenant_id,
        line=line,
        custom_id=f"r{line}",
        model=batch.model or "fake-model",
        url="/v1/chat/completions",
        body=body,
        status=status,
        deadline=batch.expires_at,
        est_input_tokens=input_tokens,  # sized as ingest sizes a line (its JSON around the body: ~60 bytes)
        max_output_tokens=output_tokens,
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        run_id=run.id if run is not None else None,
        finished_at=finished_at if status in lifecycle.REQ_TERMINAL else None,
    )
    session.add(request)
    session.flush()
    return request


def expire_leases(session: Session, request_ids: Collection[str] | None = None) -> None:
    """Let these running rows' leases lapse (every running row's by default), as if their worker stopped renewing
    them: each owner's rows move to a lease of its own that expired a second ago (a lease is a claim's, so this
    expires exactly these rows, not the rest of their claims)."""
    from storage.clock import now_f
    from storage.models import Lease

    query = select(BatchRequest.id, BatchRequest.lease_owner).where(BatchRequest.status == lifecycle.REQ_RUNNING)
    if request_ids is not None:
        query = query.where(BatchRequest.id.in_(list(request_ids)))
    owners: dict[str | None, list[str]] = {}
    for request_id, owner in session.execute(query):
        owners.setdefault(owner, []).append(request_id)
    for owner, ids in owners.items():
        lease = Lease(id=new_id("lease_"), worker_id=owner or "", expires_at=now_f() - 1)
        session.add(lease)
        session.flush()
        session.execute(update(BatchRequest).where(BatchRequest.id.in_(ids)).values(lease_id=lease.id))
