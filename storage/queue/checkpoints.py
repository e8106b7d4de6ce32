"""Generation checkpoints: the token ids a request generated so far, kept with its queue row.

A worker that hands a request back (a drain, a model switch, a pause, a shutdown) stores them in the
transaction that re-queues the row; a long generation also stores them with its lease renewals, so a
crash loses only what came after the last one. A claim hands them to the engine, which continues the
generation from there instead of decoding them again (docs/workers.md, "Checkpoints and resume").

Append-only: a write stores only the tokens generated since the row's stored checkpoint, as one
`checkpoint_chunks` row (request id, start) -> those ids, and moves `batch_requests.checkpoint_tokens` from
the count it read to the new one in the same transaction (the UPDATE is guarded by that count, so two writers
never interleave chunks, and a write never makes a checkpoint shorter). Rewriting the whole list at every
write (as a growing bytea would: Postgres rewrites a TOASTed value whole) cost the square of the output length.
A write carries the id of the claim its generation runs under (`Generated`) and lands only while the row's
`claim_id` is still that one: each claim sets a new one, so the stored ids are always a prefix of the
generation that appends to them, and a late write from an earlier holder never lands on a later one's.

A periodic checkpoint goes with a lease renewal (leases.py `renew`): the renewal itself writes no queue row (it
moves the expiry of the worker's `leases` rows, storage/queue/lease_expiry.py), so a checkpoint is the only new
version of its row; the guards are `save_checkpoints`' own (this worker's running row, the write's claim, the
count it read).

Packed compactly, never as text: little-endian int32 ids, zlib-compressed, either interleaved (a plain zlib
stream, the first version's only format: its first byte is 0x78) or byte plane by byte plane (a `PLANES`
byte, then zlib of every id's low byte, then every second byte, ...), whichever is shorter (`pack_tokens`).
Per token: ids uniform over a 128k vocabulary 2.3 bytes (2.8 interleaved; the entropy floor is 17 bits, 2.1
bytes); Zipf-distributed ids (model output) about 1.7; tokenized English prose 1.3-1.5. The chunks go when the
row ends (`drop_ended`) or its generation restarts from token 0 (`restart`).
"""

from __future__ import annotations

import logging
import sys
import zlib
from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import ColumnElement, case, delete, insert, select, update
from sqlalchemy.orm import Session

from storage import lifecycle
from storage.models import BatchRequest, CheckpointChunk
from storage.queue.enqueue import ids_match

log = logging.getLogger(__name__)


PLANES = 0x01  # the format byte of byte-plane packing; a zlib stream never starts with it (its first is 0x78)


def pack_tokens(token_ids: Sequence[int]) -> bytes:
    """Token ids as zlib-compressed little-endian int32, byte plane by byte plane or interleaved: the shorter.

    Byte planes (`PLANES`, then every id's low byte, every id's second byte, ...) compress the high bytes of
    ids below 2**17 to almost nothing: 2.3 bytes a token instead of 2.8 on ids drawn uniformly from a 128k
    vocabulary. Interleaved (the plain zlib stream the first version stored) keeps zlib's matches of repeated
    runs of whole ids, which natural-language output has: on tokenized English text the two are within 5%
    either way. Both are tried, the shorter is kept; `unpack_tokens` tells them apart by the first byte.
    """
    raw = _int32_le(token_ids)
    interleaved = zlib.compress(raw, 6)
    planes = bytes([PLANES]) + zlib.compress(b"".join(raw[k::4] for k in range(4)), 6)
    return planes if len(planes) < len(interleaved) else interleaved


def unpack_tokens(blob: bytes) -> list[int]:
    """The token ids `pack_tokens` packed (either format)."""
    if blob[:1] == bytes([PLANES]):
        planes = zlib.decompress(blob[1:])
        count = len(planes) // 4
        raw = bytearray(len(planes))
        for k in range(4):
            raw[k::4] = planes[k * count : (k + 1) * count]
        data = bytes(raw)
    else:
        data = zlib.decompress(blob)
    packed = array("i")
    packed.frombytes(data)
    if sys.byteorder == "big":
        packed.byteswap()
    return packed.tolist()


def _int32_le(token_ids: Sequence[int]) -> bytes:
    packed = array("i", token_ids)
    if sys.byteorder == "big":
        packed.byteswap()
    return packed.tobytes()


@dataclass(frozen=True)
class Generated:
    """The token ids a request generated so far, under the claim its generation runs under; `draw`: which draw of a
    checked line they are of (how many of its draws failed before it: storage/queue/draws.py), 0 for any other."""

    claim_id: str
    token_ids: Sequence[int]
    draw: int = 0


def save_checkpoints(session: Session, *, worker_id: str, checkpoints: Mapping[str, Generated]) -> set[str]:
    """Store the generated ids of rows this worker still runs (a periodic checkpoint); return the ids whose rows
    now hold them all."""
    held, moved = _append(session, checkpoints, _held_by(worker_id))
    return held | moved


def _held_by(worker_id: str) -> ColumnElement[bool]:
    return (BatchRequest.status == lifecycle.REQ_RUNNING) & (BatchRequest.lease_owner == worker_id)


def save_handed_back(session: Session, *, checkpoints: Mapping[str, Generated]) -> set[str]:
    """Store the generated ids of rows handed back from under their worker (a pause); return the ids stored.

    Only while the row is still queued and unclaimed: once another worker leased it, that worker runs it
    from whatever it found, and a late checkpoint must not change what a later claim continues from.
    """
    guard = (BatchRequest.status == lifecycle.REQ_QUEUED) & BatchRequest.lease_owner.is_(None)
    held, moved = _append(session, checkpoints, guard)
    return held | moved


def _append(session: Session, checkpoints: Mapping[str, Generated], guard: Any) -> tuple[set[str], set[str]]:
    """Read each row's count, then move it to the ids' length where it is still that; add the new ids' chunks.
    Return the ids whose rows held them all already, and those whose count this moved."""
    wanted = {rid: g for rid, g in checkpoints.items() if g.token_ids and g.claim_id}
    if not wanted:
        return set(), set()
    same_claim = BatchRequest.claim_id == case({rid: g.claim_id for rid, g in wanted.items()}, value=BatchRequest.id)
    rows = session.execute(
        select(BatchRequest.id, BatchRequest.checkpoint_tokens).where(
            ids_match(session, sorted(wanted)), guard, same_claim
        )
    ).all()
    held = {rid for rid, count in rows if count == len(wanted[rid].token_ids)}
    since = {rid: count for rid, count in rows if count < len(wanted[rid].token_ids)}
    if not since:
        return held, set()
    statement = (
        update(BatchRequest)
        .where(
            ids_match(session, sorted(since)),
            guard,
            same_claim,
            BatchRequest.checkpoint_tokens == case(since, value=BatchRequest.id),
        )
        .values(checkpoint_tokens=case({rid: len(wanted[rid].token_ids) for rid in since}, value=BatchRequest.id))
    )
    moved = set(session.scalars(statement.returning(BatchRequest.id).execution_options(synchronize_session=False)))
    if moved:
        chunks = [
            {"request_id": rid, "start": start, "token_ids": pack_tokens(wanted[rid].token_ids[start:])}
            for rid, start in since.items()
            if rid in moved
        ]
        session.execute(insert(CheckpointChunk), chunks)
    return held, moved


def seed(session: Session, *, tokens: Mapping[str, Sequence[int]]) -> None:
    """Give fresh queued rows (a continuation's copies, storage/batches/continuation.py) these ids as their
    checkpoint, one chunk each: the claim that takes a row continues its generation from there."""
    wanted = {rid: ids for rid, ids in tokens.items() if ids}
    if not wanted:
        return
    chunks = [{"request_id": rid, "start": 0, "token_ids": pack_tokens(ids)} for rid, ids in wanted.items()]
    session.execute(insert(CheckpointChunk), chunks)
    session.execute(
        update(BatchRequest)
        .where(ids_match(session, sorted(wanted)))
        .values(checkpoint_tokens=case({rid: len(ids) for rid, ids in wanted.items()}, value=BatchRequest.id))
        .execution_options(synchronize_session=False)
    )


def load(session: Session, *, counts: Mapping[str, int]) -> dict[str, list[int]]:
    """The stored ids of these rows (id -> how many their checkpoint holds), their chunks end to end.

    Called by a claim, under its lease: no write can add a chunk meanwhile. A row whose chunks do not add up to
    its count (never written so; a safety net) is read as having none and its checkpoint is dropped.
    """
    wanted = {rid: count for rid, count in counts.items() if count > 0}
    if not wanted:
        return {}
    rows = session.execute(
        select(CheckpointChunk.request_id, CheckpointChunk.start, CheckpointChunk.token_ids)
        .where(CheckpointChunk.request_id.in_(sorted(wanted)))
        .order_by(CheckpointChunk.request_id, CheckpointChunk.start)
    )
    tokens: dict[str, list[int]] = {rid: [] for rid in wanted}
    broken: set[str] = set()
    for rid, start, blob in rows:
        if start != len(tokens[rid]):
            broken.add(rid)
        elif rid not in broken:
            tokens[rid] += unpack_tokens(blob)
    broken |= {rid for rid, ids in tokens.items() if len(ids) != wanted[rid]}
    if broken:
        log.error("dropping %d checkpoints whose chunks do not add up: %s", len(broken), sorted(broken)[:5])
        _reset(session, sorted(broken))
    return {rid: ids for rid, ids in tokens.items() if rid not in broken}


def restart(session: Session, *, claims: Mapping[str, str]) -> set[str]:
    """Drop the checkpoints of rows whose engine restarted their generation (id -> the claim it runs under);
    return the ids dropped.

    The engine could not continue from them (or not from all of them), so what it generates no longer extends
    them. Only while the row is open and no later claim took it: then nothing else appends to it.
    """
    if not claims:
        return set()
    dropped = list(
        session.scalars(
            update(BatchRequest)
            .where(
                ids_match(session, sorted(claims)),
                BatchRequest.status.in_(sorted(lifecycle.REQ_OPEN)),
                BatchRequest.claim_id == case(dict(claims), value=BatchRequest.id),
            )
            .values(checkpoint_tokens=0)
            .returning(BatchRequest.id)
            .execution_options(synchronize_session=False)
        )
    )
    if dropped:
        session.execute(delete(CheckpointChunk).where(CheckpointChunk.request_id.in_(dropped)))
    return set(dropped)


def drop_ended(session: Session, *, request_ids: Sequence[str] = (), batch_id: str | None = None) -> None:
    """Delete the chunks of these rows (or of this batch's rows) that have ended: nothing will resume them.

    Called in the transaction that ends them, after the statement that did (it also sets their
    `checkpoint_tokens` to 0).
    """
    ended = select(BatchRequest.id).where(BatchRequest.status.not_in(sorted(lifecycle.REQ_OPEN)))
    chunks: ColumnElement[bool]
    if batch_id is not None:
        chunks = CheckpointChunk.request_id.in_(ended.where(BatchRequest.batch_id == batch_id))
    elif request_ids:  # looked up by the chunks' key first: most finished rows have none
        ids = sorted(request_ids)
        chunks = CheckpointChunk.request_id.in_(ids) & CheckpointChunk.request_id.in_(
            ended.where(ids_match(session, ids))
        )
    else:
        return
    session.execute(delete(CheckpointChunk).where(chunks).execution_options(synchronize_session=False))


def _reset(session: Session, request_ids: list[str]) -> None:
    session.execute(
        update(BatchRequest)
        .where(ids_match(session, request_ids))
        .values(checkpoint_tokens=0)
        .execution_options(synchronize_session=False)
    )
    session.execute(delete(CheckpointChunk).where(CheckpointChunk.request_id.in_(request_ids)))


def stored_tokens(session: Session, *, request_id: str) -> list[int]:
    """A row's checkpoint as a claim would read it (tests, benchmarks, the operator's shell)."""
    count = session.scalar(select(BatchRequest.checkpoint_tokens).where(BatchRequest.id == request_id)) or 0
    return load(session, counts={request_id: count}).get(request_id, [])


def still_open(session: Session, *, request_ids: Sequence[str]) -> set[str]:
    """The ids among these whose row is queued or running (its work will run again, not ended)."""
    if not request_ids:
        return set()
    statuses = (lifecycle.REQ_QUEUED, lifecycle.REQ_RUNNING)
    query = select(BatchRequest.id).where(ids_match(session, list(request_ids)), BatchRequest.status.in_(statuses))
    return set(session.scalars(query))
