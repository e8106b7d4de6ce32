"""Spend caps at claim time: a capped batch's requests are leased only while what it has been billed plus what
its requests in flight may cost is under its `max_cost_usd`, so at most one request crosses the cap
(docs/decisions/0018, amendment of issue 36).

A request in flight (running: leased, or finished and not yet recorded) reserves its cost at its full size,
its ingest estimate of input tokens and its `max_output_tokens`, priced by `price_job` with its batch's window
discount; a recorded result replaces that by what it was billed. The reservation is read off the running rows
themselves, so a hand-back, a reaped lease, a cancel or an expiry releases it with no bookkeeping. The claim
locks the capped batches it reads (Postgres `FOR UPDATE`, in id order, before it holds any other lock, as
every transaction takes batches before their rows; SQLite's write lock), so two claims never spend the same
room. A batch with no room is held back from the pick like a paused batch, and its queued rows wait for its
rows in flight to land. One whose spend already reached its cap (rows handed back after the stop, a cap it
was given already spent) has its queued requests ended as `budget_exceeded` here, as a recorded result would
have. Uncapped batches cost the claim nothing.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Collection
from dataclasses import dataclass, field
from decimal import Decimal

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from storage import lifecycle
from storage.finance.budgets import usd
from storage.finance.prices import PriceBook, price_book, price_job
from storage.models import Batch, BatchRequest
from storage.queue.enqueue import ids_match
from storage.queue.spend_stops import stop_at_cap
from storage.settings import Settings
from storage.wakeups import wake_after_commit


@dataclass
class Room:
    """A locked capped batch: its cap, what it was billed, and what its requests in flight may still cost."""

    batch: Batch
    cap: Decimal
    spent: Decimal = Decimal(0)
    reserved: Decimal = Decimal(0)

    @property
    def completed(self) -> int:
        """Its completed requests, as counted on the (locked) batch row: its spend changes only with this."""
        return self.batch.request_completed

    @property
    def has_room(self) -> bool:
        """One more request may be leased: spend plus reservations is still under the cap."""
        return self.spent + self.reserved < self.cap


@dataclass
class CapRooms:
    """The room of each capped batch this claim may take from, and the capped batches it must leave alone."""

    book: PriceBook
    capped: set[str] = field(default_factory=set)  # the capped batches asked about
    rooms: dict[str, Room] = field(default_factory=dict)
    held: set[str] = field(default_factory=set)  # no room, not running, or (wait=False) locked elsewhere

    def fit(self, session: Session, ids: list[str]) -> list[str]:
        """The queued ids (in claim order) this claim may lease: a capped batch's rows while it has room, each
        reserving its cost, none of a held one; a batch left without room is held back from the rest."""
        if not ids or not self.capped:
            return ids
        rows = session.execute(
            select(
                BatchRequest.id,
                BatchRequest.batch_id,
                BatchRequest.model,
                BatchRequest.est_input_tokens,
                BatchRequest.max_output_tokens,
            ).where(ids_match(session, ids), BatchRequest.batch_id.in_(sorted(self.capped)))
        )
        costs: dict[str, tuple[str, Decimal]] = {}
        for rid, batch_id, model, tokens_in, tokens_out in rows:
            room = self.rooms.get(batch_id)
            costs[rid] = (batch_id, Decimal(0) if room is None else self.cost(room.batch, model, tokens_in, tokens_out))
        kept = []
        for rid in ids:
            if rid not in costs:
                kept.append(rid)
                continue
            batch_id, cost = costs[rid]
            room = self.rooms.get(batch_id)
            if batch_id not in self.held and room is not None and room.has_room:
                room.reserved += cost
                kept.append(rid)
            else:
                self.held.add(batch_id)
        return kept

    def cost(self, batch: Batch, model: str | None, input_tokens: int, output_tokens: int, cached: int = 0) -> Decimal:
        """Billed USD of these tokens in this batch (the one pricing function, the batch's window discount)."""
        return price_job(
            self.book,
            model=model,
            created_at=batch.created_at,
            completion_window=batch.completion_window,
            input_tokens=input_tokens,
            output_tokens=output_tokens,
            busy_seconds=Decimal(0),
            cached_input_tokens=cached,
        ).billed_usd


def cap_rooms(session: Session, settings: Settings, *, batch_ids: Collection[str], wait: bool = True) -> CapRooms:
    """Lock these capped batches and read each one's room (two statements; none without batches). Batches
    paused or no longer running since they were read are held back; one whose spend reached its cap has its
    queued requests ended (`stop_at_cap`) and is held back too. A claim holds no lock yet, so it waits for a
    batch another transaction holds (a results flush: skipping it left a third of the claims of a busy capped
    batch empty); with `wait=False` (a caller holding row locks) such a batch is held back instead."""
    caps = CapRooms(price_book(settings), capped=set(batch_ids))
    wanted = sorted(caps.capped)
    if not wanted:
        return caps
    query = select(Batch).where(Batch.id.in_(wanted)).order_by(Batch.id).execution_options(populate_existing=True)
    if session.get_bind().dialect.name == "postgresql":
        query = query.with_for_update(skip_locked=not wait)
    else:  # SQLite ignores FOR UPDATE: a no-op write takes its write lock, so no other claim reads meanwhile
        session.execute(
            update(Batch).where(Batch.id.in_(wanted)).values(id=Batch.id).execution_options(synchronize_session=False)
        )
    for batch in session.scalars(query):
        if batch.status == lifecycle.IN_PROGRESS and batch.paused_at is None and batch.max_cost_micro_usd is not None:
            caps.rooms[batch.id] = Room(batch, usd(batch.max_cost_micro_usd))
    caps.held = set(wanted) - set(caps.rooms)
    _read_spend(session, caps)
    for batch_id, room in caps.rooms.items():
        if room.spent >= room.cap and stop_at_cap(session, room.batch) and not room.reserved:
            wake_after_commit(session, "batch.finalize", batch_id=batch_id)  # nothing of it is open any more
        if not room.has_room:
            caps.held.add(batch_id)
    return caps


def within_caps(session: Session, settings: Settings, *, request_ids: list[str]) -> list[str]:
    """These queued rows, less those of capped batches past their room (a lease taken back must fit as a claim
    would: the room the reaper freed when it re-queued them may have been leased to other rows since)."""
    capped = session.scalars(
        select(BatchRequest.batch_id)
        .join(Batch, Batch.id == BatchRequest.batch_id)
        .where(ids_match(session, request_ids), Batch.max_cost_micro_usd.is_not(None))
        .distinct()
    ).all()
    if not capped:
        return request_ids
    return cap_rooms(session, settings, batch_ids=capped, wait=False).fit(session, request_ids)


def _read_spend(session: Session, caps: CapRooms) -> None:
    """Each batch's billed spend (completed rows, their real tokens) and reservations (running rows, at full size),
    in one statement; a batch whose completed count is the one its spend was last read at (under this same
    lock, so no result of it is on its way) reuses that spend, and only its running rows are read."""
    if not caps.rooms:
        return
    where = str(session.get_bind().engine.url)
    known: dict[str, Decimal] = {}
    for batch_id, room in caps.rooms.items():
        if (spent := spend_cache.get(where, batch_id, room.completed)) is not None:
            known[batch_id] = spent
    fresh = sorted(set(caps.rooms) - set(known))
    rows = session.execute(
        select(
            BatchRequest.batch_id,
            BatchRequest.model,
            BatchRequest.status,
            func.sum(BatchRequest.prompt_tokens),
            func.sum(BatchRequest.completion_tokens),
            func.sum(BatchRequest.cached_tokens),
            func.sum(BatchRequest.est_input_tokens),
            func.sum(BatchRequest.max_output_tokens),
        )
        .where(
            BatchRequest.batch_id.in_(sorted(caps.rooms)),
            (BatchRequest.status == lifecycle.REQ_RUNNING)
            | ((BatchRequest.status == lifecycle.REQ_COMPLETED) & BatchRequest.batch_id.in_(fresh)),
        )
        .group_by(BatchRequest.batch_id, BatchRequest.model, BatchRequest.status)
    )
    for batch_id, model, status, prompt, completion, cached, est_input, max_output in rows:
        room = caps.rooms[batch_id]
        if status == lifecycle.REQ_COMPLETED:
            room.spent += caps.cost(room.batch, model, int(prompt or 0), int(completion or 0), int(cached or 0))
        else:
            room.reserved += caps.cost(room.batch, model, int(est_input or 0), int(max_output or 0))
    for batch_id, room in caps.rooms.items():
        if batch_id in known:
            room.spent = known[batch_id]
        else:
            spend_cache.put(where, batch_id, room.completed, room.spent)


class _SpendCache:
    """A capped batch's spend as last read, by the completed count it was read at (a completed row never
    changes, and the count moves with the rows in the transaction that records them): a claim that finds the
    count unchanged (a worker polling while another holds the batch's rows) does not sum its results again."""

    def __init__(self, size: int = 4096) -> None:
        self._lock = threading.Lock()
        self._size = size
        self._values: OrderedDict[tuple[str, str], tuple[int, Decimal]] = OrderedDict()

    def get(self, where: str, batch_id: str, completed: int) -> Decimal | None:
        with self._lock:
            value = self._values.get((where, batch_id))
        return value[1] if value is not None and value[0] == completed else None

    def put(self, where: str, batch_id: str, completed: int, spent: Decimal) -> None:
        with self._lock:
            self._values[(where, batch_id)] = (completed, spent)
            self._values.move_to_end((where, batch_id))
            while len(self._values) > self._size:
                self._values.popitem(last=False)


spend_cache = _SpendCache()
