"""Which in-progress batches each claim band takes, read from the small `batches` table.

Non-urgent work is claimed band by band: batches with a deadline before background batches, and within
each, higher `priority` first; inside a band tenants share fairly (storage/queue/claim_order.py). Held
batches (paused, or with no room under their spend cap: storage/queue/claim_caps.py) are in no band and their
rows are left out of the urgent band too. Reading the batches (not aggregating every queued row) keeps the
claim cheap at 50,000 queued rows. When every batch is in one band and none is held, the band carries no
batch filter, so the claim's queries are those of a plain queue.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from storage import lifecycle
from storage.clock import now
from storage.models import Batch
from storage.windows import BACKGROUND_WINDOW

TRIAL_RUNNING = "in_progress"  # storage/batches/trials.py RUNNING (storage/queue/ imports no workflow module)


@dataclass(frozen=True)
class OpenBatch:
    """An in-progress batch of the model being claimed, as the claim orders and caps it."""

    id: str
    tenant_id: str
    expires_at: int
    priority: int
    background: bool
    paused: bool
    capped: bool  # it has a `max_cost_usd`: the claim reserves its rows' cost (storage/queue/claim_caps.py)
    trialing: bool = False  # its trial runs: only its trial lines are claimed (storage/batches/trials.py)
    # The checks its answers must pass (storage/batches/checks.py; set at creation): the claim hands them over with
    # its rows without reading the batches again.
    checks: dict[str, Any] | None = field(default=None, compare=False)


@dataclass(frozen=True)
class Band:
    """One band of non-urgent work: its batches (None: all) and each tenant's nearest deadline in it."""

    batch_ids: tuple[str, ...] | None
    heads: dict[str, int]  # tenant id -> nearest deadline, nearest first


@dataclass(frozen=True)
class ClaimBands:
    """The bands in claim order, and the batches no claim may take from (paused, or at their spend cap)."""

    held: tuple[str, ...]
    bands: list[Band]


def open_batches(session: Session, *, model: str) -> list[OpenBatch]:
    """`model`'s in-progress batches, nearest deadline first (one read of the `batches` table)."""
    rows = session.execute(
        select(
            Batch.id,
            Batch.tenant_id,
            Batch.expires_at,
            Batch.priority,
            Batch.paused_at,
            Batch.completion_window,
            Batch.max_cost_micro_usd,
            Batch.trial_status,
            Batch.checks,
        )
        # A batch whose requests name several models (storage/protocols.py `one_model`) has no single model.
        .where(or_(Batch.model == model, Batch.model.is_(None)), Batch.status == lifecycle.IN_PROGRESS)
        .order_by(Batch.expires_at, Batch.id)
    ).all()
    return [
        OpenBatch(
            row.id,
            row.tenant_id,
            row.expires_at,
            row.priority,
            row.completion_window == BACKGROUND_WINDOW,
            row.paused_at is not None,
            row.max_cost_micro_usd is not None,
            row.trial_status == TRIAL_RUNNING,
            row.checks or None,
        )
        for row in rows
    ]


def claim_bands(batches: list[OpenBatch], *, urgent_before: int, held: Collection[str] = ()) -> ClaimBands:
    """The bands of these batches whose requests are not all urgent, in claim order; paused batches and those
    in `held` are in none."""
    kept_back = tuple(b.id for b in batches if b.paused or b.id in held)
    left_out = set(kept_back)
    floor = max(now(), urgent_before)
    grouped: dict[tuple[bool, int], list[OpenBatch]] = {}
    for batch in batches:
        if batch.id not in left_out and batch.expires_at > floor:
            grouped.setdefault((batch.background, -batch.priority), []).append(batch)
    bands = []
    for key in sorted(grouped):
        members = grouped[key]
        heads: dict[str, int] = {}
        for member in members:  # already nearest deadline first
            heads.setdefault(member.tenant_id, member.expires_at)
        whole = len(grouped) == 1 and not kept_back
        bands.append(Band(None if whole else tuple(member.id for member in members), heads))
    return ClaimBands(kept_back, bands)
