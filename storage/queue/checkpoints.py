"""Generation checkpoints: the token ids a request generated so far, kept beside its queue row.

A worker that hands a request back (a drain, a model switch, a pause, a shutdown) stores them in the
transaction that re-queues the row; a long generation also stores them with its lease renewals, so a
crash loses only what came after the last one. A claim hands them to the engine, which continues the
generation from there instead of decoding them again (docs/workers.md, "Checkpoints and resume").

Append-only: a write stores only the tokens generated since the stored checkpoint, as one `checkpoint_chunks`
row (request id, start) -> those ids, and moves the row's `checkpoints.tokens` from the count it read to the new
one in the same transaction (the UPDATE is guarded by that count, so two writers never interleave chunks, and a
write never makes a checkpoint shorter). Rewriting the whole list at every write (as a growing bytea would:
Postgres rewrites a TOASTed value whole) cost the square of the output length.

A write carries the id of the claim its generation runs under (`Generated`) and lands only while the row's
`checkpoints.claim_id` is still that one: each claim moves it to its own in the claim's transaction, after
leasing the queue row (`claimed`), and reads the count there, so the stored ids are always a prefix of the
generation that appends to them, and a late write from an earlier holder never lands on a later one's. That
guard is the whole of it: a write of a row released to the queue and not claimed since still lands (the ids are
a prefix of the generation the next claim continues), one of a row that ended finds no `checkpoints` row (the
end deleted it: `drop_ended`).

No queue row is written: on Postgres `checkpoints` and `checkpoint_chunks` are UNLOGGED, so a checkpoint costs
no WAL at all, and a database crash or failover empties them (the generations then restart from token 0:
storage/models/batches.py `Checkpoint`). A periodic checkpoint goes with a lease renewal (leases.py `renew`).

Packed compactly, never as text: little-endian int32 ids, zlib-compressed, either interleaved (a plain zlib
stream, the first version's only format: its first byte is 0x78) or byte plane by byte plane (a `PLANES`
byte, then zlib of every id's low byte, then every second byte, ...), whichever is shorter (`pack_tokens`).
Per token: ids uniform over a 128k vocabulary 2.3 bytes (2.8 interleaved; the entropy floor is 17 bits, 2.1
bytes); Zipf-distributed ids (model output) about 1.7; tokenized English prose 1.3-1.5. The chunks go when the
row ends (`drop_ended`) or its generation restarts from token 0 (`restart`); what a race leaves behind, the
reaper sweeps (`sweep`).
"""

from __future__ import annotations

import logging
import sys
import zlib
from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import ColumnElement, any_, case, delete, exists, insert, select, text, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from storage import lifecycle
from storage.models import BatchRequest, Checkpoint, CheckpointChunk
from storage.queue.enqueue import id_array, ids_match

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


UNCLAIMED = ""  # the claim of a copy's checkpoint no claim took yet (storage/batches/continuation.py)


def _ids(session: Session, column: Any, ids: Sequence[str]) -> ColumnElement[bool]:
    if session.get_bind().dialect.name == "postgresql":
        return column == any_(id_array(list(ids)))  # type: ignore[no-any-return]
    return column.in_(list(ids))  # type: ignore[no-any-return]


def claimed(session: Session, *, claim_id: str, request_ids: Sequence[str]) -> dict[str, int]:
    """Move these rows' checkpoints to the claim that just leased them, creating the ones a row lacks; return how
    many ids each holds. Called by the claim after it leased the rows, in its transaction: a write of an earlier
    claim either landed before (and is counted) or finds another claim and lands nowhere."""
    if not request_ids:
        return {}
    if session.get_bind().dialect.name == "postgresql":  # fixed text, the ids as one string (enqueue.py `id_array`)
        params = {"ids": ",".join(sorted(request_ids)), "claim": claim_id}
        return dict(session.execute(_CLAIMED, params).tuples().all())
    rows = [{"request_id": rid, "claim_id": claim_id, "tokens": 0} for rid in sorted(request_ids)]
    statement = sqlite.insert(Checkpoint).values(rows)
    statement = statement.on_conflict_do_update(
        index_elements=[Checkpoint.request_id], set_={"claim_id": statement.excluded.claim_id}
    )
    returned = session.execute(statement.returning(Checkpoint.request_id, Checkpoint.tokens))
    return {rid: tokens for rid, tokens in returned}


_CLAIMED = text(
    """
    INSERT INTO checkpoints (request_id, claim_id, tokens)
    SELECT id, :claim, 0 FROM unnest(string_to_array(:ids, ',')) AS id
    ON CONFLICT (request_id) DO UPDATE SET claim_id = excluded.claim_id
    RETURNING request_id, tokens
    """
)


def counts(session: Session, *, request_ids: Sequence[str]) -> dict[str, int]:
    """How many ids the checkpoints of these rows hold (those with none: 0)."""
    found: dict[str, int] = {rid: 0 for rid in request_ids}
    if request_ids:
        query = select(Checkpoint.request_id, Checkpoint.tokens).where(
            _ids(session, Checkpoint.request_id, request_ids)
        )
        found.update(dict(session.execute(query).tuples().all()))
    return found


def save(session: Session, *, checkpoints: Mapping[str, Generated]) -> set[str]:
    """Store the generated ids of these rows where their claim still holds the checkpoint (a periodic checkpoint,
    or a hand-back's); return the ids whose rows now hold them all."""
    wanted = {rid: g for rid, g in checkpoints.items() if g.token_ids and g.claim_id}
    if not wanted:
        return set()
    same_claim = Checkpoint.claim_id == case(
        {rid: g.claim_id for rid, g in wanted.items()}, value=Checkpoint.request_id
    )
    mine = _ids(session, Checkpoint.request_id, sorted(wanted))
    rows = session.execute(select(Checkpoint.request_id, Checkpoint.tokens).where(mine, same_claim)).all()
    held = {rid for rid, count in rows if count == len(wanted[rid].token_ids)}
    since = {rid: count for rid, count in rows if count < len(wanted[rid].token_ids)}
    if not since:
        return held
    statement = (
        update(Checkpoint)
        .where(
            _ids(session, Checkpoint.request_id, sorted(since)),
            same_claim,
            Checkpoint.tokens == case(since, value=Checkpoint.request_id),
        )
        .values(tokens=case({rid: len(wanted[rid].token_ids) for rid in since}, value=Checkpoint.request_id))
    )
    moved = set(
        session.scalars(statement.returning(Checkpoint.request_id).execution_options(synchronize_session=False))
    )
    if moved:
        chunks = [
            {"request_id": rid, "start": start, "token_ids": pack_tokens(wanted[rid].token_ids[start:])}
            for rid, start in since.items()
            if rid in moved
        ]
        session.execute(insert(CheckpointChunk), chunks)
    return held | moved


def seed(session: Session, *, tokens: Mapping[str, Sequence[int]]) -> None:
    """Give fresh queued rows (a continuation's copies, storage/batches/continuation.py) these ids as their
    checkpoint, one chunk each, under no claim yet: the claim that takes a row continues its generation from there."""
    wanted = {rid: ids for rid, ids in tokens.items() if ids}
    if not wanted:
        return
    rows = [{"request_id": rid, "claim_id": UNCLAIMED, "tokens": len(ids)} for rid, ids in wanted.items()]
    session.execute(insert(Checkpoint), rows)
    chunks = [{"request_id": rid, "start": 0, "token_ids": pack_tokens(ids)} for rid, ids in wanted.items()]
    session.execute(insert(CheckpointChunk), chunks)


def append_unclaimed(session: Session, *, request_id: str, count: int, tokens: Sequence[int]) -> bool:
    """Move a checkpoint no claim took yet from `count` ids to these (of which the first `count` are the stored
    ones), creating it at 0; whether it moved. The caller holds the queue row, unclaimed
    (storage/queue/copy_tokens.py)."""
    if count >= len(tokens):
        return False
    row = {"request_id": request_id, "claim_id": UNCLAIMED, "tokens": len(tokens)}
    dialect = postgresql if session.get_bind().dialect.name == "postgresql" else sqlite
    statement = dialect.insert(Checkpoint).values(row)
    statement = statement.on_conflict_do_update(
        index_elements=[Checkpoint.request_id],
        set_={"tokens": len(tokens)},
        where=(Checkpoint.claim_id == UNCLAIMED) & (Checkpoint.tokens == count),
    )
    if count == 0:  # none stored: a row with ids left by an earlier try goes too
        session.execute(delete(CheckpointChunk).where(CheckpointChunk.request_id == request_id))
    if session.scalar(statement.returning(Checkpoint.request_id)) is None:
        return False
    chunk = {"request_id": request_id, "start": count, "token_ids": pack_tokens(tokens[count:])}
    session.execute(insert(CheckpointChunk), [chunk])
    return True


def load(session: Session, *, counts: Mapping[str, int]) -> dict[str, list[int]]:
    """The stored ids of these rows (id -> how many their checkpoint holds), their chunks end to end.

    Called by a claim, after `claimed`: no write can add a chunk meanwhile. A row whose chunks do not add up to
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
        clear(session, request_ids=sorted(broken))
    return {rid: ids for rid, ids in tokens.items() if rid not in broken}


def restart(session: Session, *, claims: Mapping[str, str]) -> set[str]:
    """Drop the checkpoints of rows whose engine restarted their generation (id -> the claim it runs under);
    return the ids dropped.

    The engine could not continue from them (or not from all of them), so what it generates no longer extends
    them. Only while no later claim took the row: then nothing else appends to it.
    """
    if not claims:
        return set()
    dropped = list(
        session.scalars(
            update(Checkpoint)
            .where(
                _ids(session, Checkpoint.request_id, sorted(claims)),
                Checkpoint.claim_id == case(dict(claims), value=Checkpoint.request_id),
            )
            .values(tokens=0)
            .returning(Checkpoint.request_id)
            .execution_options(synchronize_session=False)
        )
    )
    if dropped:
        session.execute(delete(CheckpointChunk).where(CheckpointChunk.request_id.in_(dropped)))
    return set(dropped)


def clear(session: Session, *, request_ids: Sequence[str]) -> None:
    """Empty these rows' checkpoints (their count 0, their chunks gone), whatever claim holds them; the caller
    holds the rows."""
    if not request_ids:
        return
    session.execute(
        update(Checkpoint)
        .where(_ids(session, Checkpoint.request_id, request_ids))
        .values(tokens=0)
        .execution_options(synchronize_session=False)
    )
    session.execute(delete(CheckpointChunk).where(CheckpointChunk.request_id.in_(list(request_ids))))


def drop_ended(session: Session, *, request_ids: Sequence[str] = (), batch_id: str | None = None) -> None:
    """Delete the checkpoints of these rows (or of this batch's rows) that have ended: nothing will resume them.

    Called in the transaction that ends them, after the statement that did. The count first: a write it waited
    for has committed its chunks by the time the chunks' statement starts, so they go too.
    """
    ended = select(BatchRequest.id).where(BatchRequest.status.not_in(sorted(lifecycle.REQ_OPEN)))
    if batch_id is not None:
        ended = ended.where(BatchRequest.batch_id == batch_id)
    elif request_ids:
        ended = ended.where(ids_match(session, sorted(request_ids)))
    else:
        return
    for table in (Checkpoint, CheckpointChunk):
        mine: ColumnElement[bool] = table.request_id.in_(ended)
        if batch_id is None:  # looked up by the table's own key first
            mine = _ids(session, table.request_id, sorted(request_ids)) & mine
        session.execute(delete(table).where(mine).execution_options(synchronize_session=False))


def sweep(session: Session, *, limit: int = 1000) -> int:
    """Delete up to `limit` checkpoints whose row is gone or ended, and chunks with no checkpoint (a write that
    raced an end, a row deleted with its batch); return how many rows went."""
    open_row = select(BatchRequest.id).where(
        BatchRequest.id == Checkpoint.request_id, BatchRequest.status.in_(sorted(lifecycle.REQ_OPEN))
    )
    stale = select(Checkpoint.request_id).where(~exists(open_row)).limit(limit)
    gone = session.execute(delete(Checkpoint).where(Checkpoint.request_id.in_(stale)))
    counted = select(Checkpoint.request_id).where(Checkpoint.request_id == CheckpointChunk.request_id)
    loose = select(CheckpointChunk.request_id).where(~exists(counted)).limit(limit)
    lost = session.execute(delete(CheckpointChunk).where(CheckpointChunk.request_id.in_(loose)))
    return int(gone.rowcount or 0) + int(lost.rowcount or 0)  # type: ignore[attr-defined]


def stored_tokens(session: Session, *, request_id: str) -> list[int]:
    """A row's checkpoint as a claim would read it (tests, benchmarks, the operator's shell)."""
    return load(session, counts=counts(session, request_ids=[request_id])).get(request_id, [])


def still_open(session: Session, *, request_ids: Sequence[str]) -> set[str]:
    """The ids among these whose row is queued or running (its work will run again, not ended)."""
    if not request_ids:
        return set()
    statuses = (lifecycle.REQ_QUEUED, lifecycle.REQ_RUNNING)
    query = select(BatchRequest.id).where(ids_match(session, list(request_ids)), BatchRequest.status.in_(statuses))
    return set(session.scalars(query))
