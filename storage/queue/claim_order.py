"""The order in which `storage.queue.claim.claim` hands out queued work: the deadline ramp and prefix grouping.

First the urgent band: *urgent* requests — deadline nearer than the urgency horizon — go first, earliest deadline
first across all tenants, because a request that misses its deadline is worth nothing. The horizon is the
larger of `urgent_within_seconds` and `urgent_drain_multiple` x the time the node needs to drain the
model's whole backlog at its measured throughput, so the ramp widens on its own when the node falls
behind (under overload everything is urgent and the queue is plain EDF). Everything else is shared fairly
by tenant, band by band (higher priority first, background batches last; paused batches, and those with no
room under their spend cap, not at all: storage/queue/claim_bands.py, claim_caps.py); within a tenant's share
rows are taken by deadline bucket, then prefix key, so requests that share a prompt prefix (a system prompt) run
together and vLLM's prefix cache serves them. Rows whose prefix no other line of their file shares keep the
empty key and go in line order.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Select, all_, func, or_, select, true
from sqlalchemy.orm import Session

from storage import lifecycle
from storage.clock import now
from storage.models import BatchRequest
from storage.queue.backlog import drain_seconds
from storage.queue.claim_bands import OpenBatch, claim_bands, open_batches
from storage.queue.enqueue import id_array
from storage.queue.fleet_backlog import fleet_backlog
from storage.settings import Settings

HORIZON_MAX_AGE_SECONDS = 15.0


@dataclass(frozen=True)
class ClaimOrder:
    """How one claim orders the queue: the urgency cutoff and whether to group by prompt prefix."""

    urgent_before: int = 0  # unix seconds: a deadline at or before this is urgent
    prefix_ordering: bool = False
    bucket_seconds: int = 3600  # deadlines within one bucket count as equal when grouping by prefix

    def is_urgent(self, deadline: int) -> bool:
        """True if a request with this deadline is claimed ahead of the fair share."""
        return deadline <= self.urgent_before

    def sort_key(
        self, deadline: int, prefix_key: str, picked: int, adapter: str | None = None
    ) -> tuple[int, int, str, str, int, int]:
        """Where a picked row goes in the claim (the order the engine receives it): urgent first, EDF;
        then by deadline bucket and prefix (or by deadline alone); `picked` keeps the pick order. Inside each
        deadline (bucket), rows of one LoRA adapter go together (the base model's first), so the engine meets each
        adapter once per claim and swaps adapters rarely (docs/adapters.md)."""
        lora = "" if adapter is None else f"~{adapter}"
        if self.is_urgent(deadline):
            return (0, deadline, lora, prefix_key, deadline, picked)
        if self.prefix_ordering:
            return (1, deadline // self.bucket_seconds, lora, prefix_key, deadline, picked)
        return (1, deadline, lora, "", deadline, picked)


class _DrainCache:
    """Backlog drain time per (database, model), recomputed at most every HORIZON_MAX_AGE_SECONDS: sizing
    the backlog reads every open row's index entry, too much to do on each claim. On Postgres from the sum the
    fleet shares (storage/queue/fleet_backlog.py): one process re-sums it per interval, the others read one row."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._computing = threading.Lock()  # one thread reads the backlog at a time; the others use the last value
        self._values: dict[tuple[str, str], tuple[float, float]] = {}

    def get(self, session: Session, *, model: str, settings: Settings) -> float:
        key = (str(session.get_bind().engine.url), model)
        with self._lock:
            cached = self._values.get(key)
        if cached is not None and time.monotonic() - cached[0] < HORIZON_MAX_AGE_SECONDS:
            return cached[1]
        # Stale: one thread recomputes while the others go on with the stale value (a process's claimer threads all
        # found it stale at once and each read every open row: 12 concurrent scans of 200,000 rows, bench/fleet.py).
        if not self._computing.acquire(blocking=cached is None):
            return cached[1] if cached is not None else 0.0
        try:
            age = 0.0
            if session.get_bind().dialect.name == "postgresql":  # the fleet's last sum (storage/queue/fleet_backlog.py)
                queued, age = fleet_backlog(session, settings, model=model, max_age_seconds=HORIZON_MAX_AGE_SECONDS)
                seconds = drain_seconds(session, model=model, settings=settings, queued=queued)
            else:
                seconds = drain_seconds(session, model=model, settings=settings)
        finally:
            self._computing.release()
        with self._lock:  # as old as the sum it came from: no older than HORIZON_MAX_AGE_SECONDS in all
            self._values[key] = (time.monotonic() - age, seconds)
        return seconds

    def clear(self) -> None:
        with self._lock:
            self._values.clear()


drain_cache = _DrainCache()


def urgency_horizon(session: Session, *, model: str, settings: Settings) -> float:
    """Seconds before its deadline at which a request of `model` becomes urgent."""
    floor = float(settings.urgent_within_seconds)
    if settings.urgent_drain_multiple <= 0:
        return floor
    return max(floor, settings.urgent_drain_multiple * drain_cache.get(session, model=model, settings=settings))


def claim_order(session: Session, *, model: str, settings: Settings) -> ClaimOrder:
    """The claim order in force now for `model`, from the settings and the backlog."""
    horizon = urgency_horizon(session, model=model, settings=settings)
    return ClaimOrder(
        urgent_before=now() + int(horizon),
        prefix_ordering=settings.prefix_ordering,
        bucket_seconds=settings.prefix_deadline_bucket_seconds,
    )


# A picked row: (id, deadline, prefix_key, adapter, batch_id), the columns PICKED_COLUMNS selects.
Picked = tuple[str, int, str, str | None, str]
PICKED_COLUMNS = (
    BatchRequest.id,
    BatchRequest.deadline,
    BatchRequest.prefix_key,
    BatchRequest.adapter,
    BatchRequest.batch_id,
)


_EDF_ORDER = (BatchRequest.deadline, BatchRequest.prefix_key, BatchRequest.batch_id, BatchRequest.line)


_PREFIX_ORDER = (BatchRequest.prefix_key, BatchRequest.deadline, BatchRequest.batch_id, BatchRequest.line)


_DEADLINE_ORDER = (BatchRequest.deadline, BatchRequest.batch_id, BatchRequest.line)


def pick(
    session: Session,
    *,
    model: str,
    limit: int,
    order: ClaimOrder,
    batches: list[OpenBatch] | None = None,
    held: Collection[str] = (),
    taken: list[str] | None = None,
) -> list[str]:
    """Lock (SKIP LOCKED) up to `limit` queued rows of `model` and return their ids in claim order: urgent rows
    (EDF), then band by band (storage/queue/claim_bands.py: deadline work before background, higher priority
    first), a fair share across tenants inside each band. Rows of paused batches, of those in `held` (no room
    under their spend cap) and those in `taken` (this claim's already) are never picked. `batches`: what
    `open_batches` read, if the caller did."""
    current = now()
    if batches is None:
        batches = open_batches(session, model=model)
    bands = claim_bands(batches, urgent_before=order.urgent_before, held=held)
    queued: tuple[Any, ...] = (
        BatchRequest.model == model,
        BatchRequest.status == lifecycle.REQ_QUEUED,
        BatchRequest.deadline > current,
    )
    if bands.held:
        queued = (*queued, BatchRequest.batch_id.not_in(bands.held))
    if taken:
        queued = (*queued, _not_picked(session, taken))
    if trialing := [b.id for b in batches if b.trialing]:  # a batch in its trial gives its trial lines only
        queued = (*queued, or_(BatchRequest.batch_id.not_in(trialing), BatchRequest.trial.is_(True)))
    picked: list[Picked] = []
    if order.urgent_before > current:
        urgent = select(*PICKED_COLUMNS).where(*queued, BatchRequest.deadline <= order.urgent_before)
        picked = _locked(session, urgent, _EDF_ORDER, limit)
    band_of = [0] * len(picked)
    rest = (*queued, BatchRequest.deadline > order.urgent_before)
    for index, band in enumerate(bands.bands):
        if len(picked) >= limit:
            break
        where = rest if band.batch_ids is None else (*rest, BatchRequest.batch_id.in_(band.batch_ids))
        rows = _pick_shared(session, queued=where, heads=band.heads, order=order, limit=limit - len(picked))
        picked += rows
        band_of += [index] * len(rows)

    # Only rows of batches `batches` holds: one whose ingest committed after that read (its pick is a later
    # statement) has a cap, a pause or a trial this claim knows nothing of. Its rows stay queued, locked until this
    # transaction ends, for the next claim, which reads the batch.
    known = {batch.id for batch in batches}
    kept = [i for i, row in enumerate(picked) if row[4] in known]
    picked, band_of = [picked[i] for i in kept], [band_of[i] for i in kept]

    def rank(i: int) -> tuple[Any, ...]:
        key = order.sort_key(picked[i][1], picked[i][2], i, picked[i][3])
        return (key[0], band_of[i], *key[1:])

    return [picked[i][0] for i in sorted(range(len(picked)), key=rank)]


def _locked(
    session: Session, query: Select[str, int, str, str | None, str], ordering: tuple[Any, ...], limit: int
) -> list[Picked]:
    """The first `limit` rows of `query` in `ordering`, locked, skipping rows other workers hold."""
    rows = session.execute(query.order_by(*ordering).limit(limit).with_for_update(skip_locked=True))
    return [(row[0], row[1], row[2], row[3], row[4]) for row in rows]


def _pick_shared(
    session: Session, *, queued: tuple[Any, ...], heads: dict[str, int], order: ClaimOrder, limit: int
) -> list[Picked]:
    """Equal shares per tenant, nearest deadline first; shares a tenant cannot fill pass to the others.

    `heads` (each tenant's nearest deadline, nearest first) comes from the small `batches` table rather than
    from aggregating every queued row on each claim, which cost tens of milliseconds at 50,000 queued rows.
    """
    if limit <= 0:
        return []
    tenants = dict(heads)
    picked: list[Picked] = []
    remaining = limit
    while tenants and remaining > 0:
        share = max(1, math.ceil(remaining / len(tenants)))
        still_more: dict[str, int] = {}
        for tenant_id, head in tenants.items():
            take = min(share, remaining)
            if take <= 0:
                break
            mine = (*queued, BatchRequest.tenant_id == tenant_id, _not_picked(session, [p[0] for p in picked]))
            rows = _pick_tenant(session, where=mine, order=order, head=head, limit=take)
            picked.extend(rows)
            remaining -= len(rows)
            if len(rows) == take:
                still_more[tenant_id] = head
        tenants = still_more
    return picked


def _not_picked(session: Session, ids: list[str]) -> Any:
    """Leave out rows this claim already holds (SKIP LOCKED does not skip a transaction's own locks)."""
    if not ids:
        return true()
    if session.get_bind().dialect.name == "postgresql":
        return BatchRequest.id != all_(id_array(ids))
    return BatchRequest.id.not_in(ids)


def _pick_tenant(session: Session, *, where: tuple[Any, ...], order: ClaimOrder, head: int, limit: int) -> list[Picked]:
    """One tenant's next rows: by deadline, or deadline bucket by bucket and by prefix key inside each."""
    if not order.prefix_ordering:
        return _locked(session, select(*PICKED_COLUMNS).where(*where), _DEADLINE_ORDER, limit)
    rows: list[Picked] = []
    start: int | None = head
    while start is not None and len(rows) < limit:
        end = (start // order.bucket_seconds + 1) * order.bucket_seconds
        bucket = select(*PICKED_COLUMNS).where(*where, BatchRequest.deadline >= start, BatchRequest.deadline < end)
        rows += _locked(session, bucket, _PREFIX_ORDER, limit - len(rows))
        if len(rows) < limit:
            start = session.scalar(select(func.min(BatchRequest.deadline)).where(*where, BatchRequest.deadline >= end))
    return rows
