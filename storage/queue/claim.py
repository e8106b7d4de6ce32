"""Claiming: lease queued requests to a worker, in the order `claim_order` gives.

Rows are locked with SKIP LOCKED and leased with an expiry; no transaction is ever held open across
inference. Each claim stamps its rows with a new `claim_id` and hands over their checkpoints, the stored
chunks end to end (storage/queue/checkpoints.py): only that claim's generation appends to them from then on.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from sqlalchemy import ColumnElement, Select, exists, false, select, update
from sqlalchemy.orm import Session

from storage import lifecycle
from storage.adapters.registry import adapter_paths
from storage.clock import now
from storage.ids import new_id
from storage.models import Batch, BatchRequest, Tenant
from storage.queue import checkpoints
from storage.queue.claim_bands import open_batches
from storage.queue.claim_caps import cap_rooms
from storage.queue.claim_order import ClaimOrder, claim_order, pick
from storage.queue.draws import Draws, draws_of
from storage.queue.enqueue import ids_match
from storage.queue.expiry import cut_candidates
from storage.queue.lease_expiry import open_lease
from storage.settings import Settings


@dataclass(frozen=True)
class ClaimedRequest:
    """A leased queue row, as the runner needs it."""

    id: str
    batch_id: str
    tenant_id: str
    url: str
    body: dict[str, Any]
    deadline: int
    # Inside the urgency horizon (see storage/queue/claim_order.py): a worker holding urgent rows may ask for
    # more capacity (in shared mode, from online traffic) so they finish before their deadline.
    urgent: bool = False
    attempts: int = 1  # this lease included: more than 1 is a re-claim (a lease expired or was handed back)
    # Token ids generated before a hand-back or a crash, in order (storage/queue/checkpoints.py): the engine
    # continues the generation after them.
    checkpoint: tuple[int, ...] = ()
    claim_id: str = ""  # this claim's id: the generation's checkpoint writes carry it (storage/queue/checkpoints.py)
    # Its batch has a spend cap or its tenant a monthly budget: the runner hands its result to the database at
    # once, where the cap is checked, so the overrun stays within the rows held (docs/decisions/0018).
    capped: bool = False
    adapter: str | None = None  # the LoRA adapter the line named (docs/adapters.md)
    adapter_path: str | None = None  # its folder; None with `adapter` set: no longer registered
    # Its batch's checks (storage/batches/checks.py): the runner checks each answer and draws a failing one again.
    checks: dict[str, Any] | None = None
    # The draws it made before a hand-back that failed its checks (storage/queue/draws.py): the runner goes on with
    # the next one.
    draws: Draws = field(default_factory=Draws)
    # Its batch's window closed and it holds a checkpoint (storage/queue/expiry.py `cut_candidates`): the runner
    # answers it at once from those tokens, cut short, generating none after the deadline.
    overdue: bool = False


def claim(
    session: Session,
    *,
    model: str,
    worker_id: str,
    limit: int,
    lease_seconds: int,
    settings: Settings,
    order: ClaimOrder | None = None,
    held: Collection[str] = (),
) -> list[ClaimedRequest]:
    """Lease up to `limit` queued requests of `model`: urgent work first, then a fair share per tenant.

    Urgent rows (deadline inside the urgency horizon) go first, earliest deadline first across tenants;
    the rest is shared equally by tenant, grouped by prompt prefix within a deadline bucket (see
    storage/queue/claim_order.py). Rows are locked with SKIP LOCKED, so concurrent workers never claim the same
    row. A batch with a spend cap gets rows only while its spend plus its rows in flight is under the cap
    (storage/queue/claim_caps.py). `order` defaults to the one `settings` and the backlog give. A row in
    `held` (already running in this worker's engine, re-queued under it by the reaper) is a re-lease: its
    attempt is given back.
    """
    if limit <= 0:
        return []
    if order is None:
        order = claim_order(session, model=model, settings=settings)
    batches = open_batches(session, model=model)
    caps = cap_rooms(session, settings, batch_ids=[b.id for b in batches if b.capped and not b.paused])
    # Expired with tokens, to be cut short (expiry.py): only rows of an in-progress batch past its window, so with no
    # such batch among the model's (`batches`: every batch its rows can be in) there is nothing to look for.
    past_window = any(batch.expires_at <= now() for batch in batches)
    ids = cut_candidates(session, model=model, limit=limit) if past_window else []
    overdue = set(ids)
    while len(ids) < limit:  # again only when a spend cap left rows out: each pass holds back one more batch
        picked = pick(
            session, model=model, limit=limit - len(ids), order=order, batches=batches, held=caps.held, taken=ids
        )
        fitted = caps.fit(session, picked)
        ids += fitted
        if len(fitted) == len(picked):
            break
    if not ids:
        return []
    claimed = _lease(
        session,
        ids=ids,
        worker_id=worker_id,
        lease_seconds=lease_seconds,
        urgent_before=order.urgent_before,
        checks={batch.id: batch.checks for batch in batches},
    )
    claimed = [replace(item, overdue=True) if item.id in overdue else item for item in claimed]
    if named := {item.adapter for item in claimed if item.adapter is not None}:
        paths = adapter_paths(session, settings, names=named)
        claimed = [replace(item, adapter_path=paths.get(item.adapter)) if item.adapter else item for item in claimed]
    if again := [item.id for item in claimed if item.id in held]:
        session.execute(
            update(BatchRequest)
            .where(ids_match(session, again))
            .values(attempts=BatchRequest.attempts - 1)
            .execution_options(synchronize_session=False)
        )
    return claimed


def _lease(
    session: Session,
    *,
    ids: list[str],
    worker_id: str,
    lease_seconds: int,
    urgent_before: int = 0,
    checks: dict[str, dict[str, Any] | None] | None = None,
) -> list[ClaimedRequest]:
    """Mark the picked rows running under this worker's lease and read them back in one statement; then read
    their checkpoints. `checks`: the batches' checks the caller already read (batch id -> checks or None); those of
    other batches are read here."""
    claim_id = new_id("claim_")
    postgres = session.get_bind().dialect.name == "postgresql"
    rows = session.execute(
        update(BatchRequest)
        # Still queued: SQLite's pick locks nothing, so a cancel or expiry may have ended a row since.
        .where(ids_match(session, ids), lifecycle.rows_moving(lifecycle.REQ_QUEUED, to=lifecycle.REQ_RUNNING))
        .values(
            status=lifecycle.REQ_RUNNING,
            lease_owner=worker_id,
            lease_id=claim_id,  # the claim's lease, inserted below: renewals move its expiry, not the rows'
            attempts=BatchRequest.attempts + 1,
            claim_id=claim_id,
        )
        .returning(
            BatchRequest.id,
            BatchRequest.batch_id,
            BatchRequest.tenant_id,
            BatchRequest.url,
            BatchRequest.body,
            BatchRequest.deadline,
            BatchRequest.attempts,
            _capped() if postgres else false(),
            BatchRequest.adapter,
            BatchRequest.draws,
        )
        .execution_options(synchronize_session=False)
    ).all()
    if rows:  # storage/queue/lease_expiry.py; in this transaction, so no one sees the rows without it
        open_lease(session, worker_id=worker_id, lease_seconds=lease_seconds, lease_id=claim_id)
    order = {request_id: index for index, request_id in enumerate(ids)}
    # The checkpoints move to this claim: no earlier claim's write lands on them after this.
    stored = checkpoints.load(
        session, counts=checkpoints.claimed(session, claim_id=claim_id, request_ids=[r[0] for r in rows])
    )
    claimed = [
        ClaimedRequest(
            id=rid,
            batch_id=batch_id,
            tenant_id=tenant,
            url=url,
            body=body,
            deadline=deadline,
            urgent=deadline <= urgent_before,
            attempts=attempts,
            claim_id=claim_id,
            capped=bool(capped),
            adapter=adapter,
            draws=draws_of(draws),
        )
        for rid, batch_id, tenant, url, body, deadline, attempts, capped, adapter, draws in rows
    ]
    claimed = [replace(item, checkpoint=tuple(stored[item.id])) if item.id in stored else item for item in claimed]
    if not postgres and (capped_ids := set(session.scalars(_capped_batches(item.batch_id for item in claimed)))):
        claimed = [replace(item, capped=True) if item.batch_id in capped_ids else item for item in claimed]
    known = checks or {}
    checked = {batch_id: found for batch_id, found in known.items() if found}
    checked |= _checks_of(session, batch_ids={item.batch_id for item in claimed} - set(known))
    if checked:
        claimed = [
            replace(item, checks=checked[item.batch_id]) if item.batch_id in checked else item for item in claimed
        ]
    claimed.sort(key=lambda item: order[item.id])  # `ids` is already in claim order
    return claimed


def _checks_of(session: Session, *, batch_ids: set[str]) -> dict[str, dict[str, Any]]:
    """The checks of those of these batches that have any (one read of the small `batches` table)."""
    if not batch_ids:
        return {}
    rows = session.execute(select(Batch.id, Batch.checks).where(Batch.id.in_(sorted(batch_ids))))
    return {batch_id: checks for batch_id, checks in rows if checks}


_CAPPED = Batch.max_cost_micro_usd.is_not(None) | Tenant.monthly_budget_micro_usd.is_not(None)


def _capped() -> ColumnElement[bool]:
    """Per leased row, read in the lease's own statement (Postgres): its batch has a spend cap or its tenant a
    monthly budget. SQLite's RETURNING names no other table, so there `_capped_batches` asks afterwards."""
    return exists(
        select(Batch.id).join(Tenant, Tenant.id == Batch.tenant_id).where(Batch.id == BatchRequest.batch_id, _CAPPED)
    )


def _capped_batches(batch_ids: Iterable[str]) -> Select[str]:
    """The batches among these with a spend cap, or whose tenant has a monthly budget."""
    return (
        select(Batch.id).join(Tenant, Tenant.id == Batch.tenant_id).where(Batch.id.in_(sorted(set(batch_ids))), _CAPPED)
    )
