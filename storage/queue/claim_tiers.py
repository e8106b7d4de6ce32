"""Which in-progress batches each claim band takes, read from the small `batches` table.

Non-urgent work is claimed band by band: batches with a deadline before background batches, and within
each, higher `priority` first; inside a band tenants share fairly (storage/queue/claim_order.py). Paused
batches are in no band and their rows are left out of the urgent tier too. Reading the batches (not
aggregating every queued row) keeps the claim cheap at 50,000 queued rows. When every batch is in one band
and none is paused, the band carries no batch filter, so the claim's queries are those of a plain queue.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from storage.batches import lifecycle
from storage.batches.windows import BACKGROUND_WINDOW
from storage.clock import now
from storage.models import Batch


@dataclass(frozen=True)
class Band:
    """One band of non-urgent work: its batches (None: all) and each tenant's nearest deadline in it."""

    batch_ids: tuple[str, ...] | None
    heads: dict[str, int]  # tenant id -> nearest deadline, nearest first


@dataclass(frozen=True)
class ClaimBands:
    """The bands in claim order, and the batches no claim may take from (paused)."""

    paused: tuple[str, ...]
    bands: list[Band]


def claim_bands(session: Session, *, model: str, urgent_before: int) -> ClaimBands:
    """The bands of `model`'s in-progress batches whose requests are not all urgent, in claim order."""
    rows = session.execute(
        select(Batch.id, Batch.tenant_id, Batch.expires_at, Batch.priority, Batch.paused_at, Batch.completion_window)
        # A batch whose requests name several models (an Anthropic Message Batch) has no single model.
        .where(or_(Batch.model == model, Batch.model.is_(None)), Batch.status == lifecycle.IN_PROGRESS)
        .order_by(Batch.expires_at, Batch.id)
    ).all()
    paused = tuple(row.id for row in rows if row.paused_at is not None)
    floor = max(now(), urgent_before)
    grouped: dict[tuple[bool, int], list[tuple[str, str, int]]] = {}
    for row in rows:
        if row.paused_at is None and row.expires_at > floor:
            key = (row.completion_window == BACKGROUND_WINDOW, -row.priority)
            grouped.setdefault(key, []).append((row.id, row.tenant_id, row.expires_at))
    bands = []
    for key in sorted(grouped):
        members = grouped[key]
        heads: dict[str, int] = {}
        for _, tenant_id, expires_at in members:  # already nearest deadline first
            heads.setdefault(tenant_id, expires_at)
        whole = len(grouped) == 1 and not paused
        bands.append(Band(None if whole else tuple(batch_id for batch_id, _, _ in members), heads))
    return ClaimBands(paused, bands)
