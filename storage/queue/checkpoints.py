"""Generation checkpoints: the token ids a request generated so far, kept with its queue row.

A worker that hands a request back (a drain, a model switch, a pause, a shutdown) stores them in the
transaction that re-queues the row; a long generation also stores them with its lease renewals, so a
crash loses only what came after the last one. A claim hands them to the engine, which continues the
generation from there instead of decoding them again (docs/workers.md, "Checkpoints and resume").

Stored compactly: little-endian int32 ids, zlib-compressed (about 2-3 bytes a token), never text. A write
never replaces a checkpoint with a shorter one (`checkpoint_tokens` guards it without unpacking).
"""

from __future__ import annotations

import sys
import zlib
from array import array
from collections.abc import Mapping, Sequence
from typing import Any, cast

from sqlalchemy import Table, bindparam, select
from sqlalchemy.orm import Session

from storage.batches import lifecycle
from storage.models import BatchRequest
from storage.queue.enqueue import ids_match


def pack_tokens(token_ids: Sequence[int]) -> bytes:
    """Token ids as zlib-compressed little-endian int32."""
    packed = array("i", token_ids)
    if sys.byteorder == "big":
        packed.byteswap()
    return zlib.compress(packed.tobytes(), 6)


def unpack_tokens(blob: bytes) -> list[int]:
    """The token ids `pack_tokens` packed."""
    packed = array("i")
    packed.frombytes(zlib.decompress(blob))
    if sys.byteorder == "big":
        packed.byteswap()
    return packed.tolist()


def save_checkpoints(session: Session, *, worker_id: str, checkpoints: Mapping[str, Sequence[int]]) -> set[str]:
    """Store the generated ids of rows this worker still runs (a periodic checkpoint); return the ids stored."""
    table = cast(Table, BatchRequest.__table__)
    guard = (table.c.status == lifecycle.REQ_RUNNING) & (table.c.lease_owner == worker_id)
    return _save(session, checkpoints, guard)


def save_handed_back(session: Session, *, checkpoints: Mapping[str, Sequence[int]]) -> set[str]:
    """Store the generated ids of rows handed back from under their worker (a pause); return the ids stored.

    Only while the row is still queued and unclaimed: once another worker leased it, that worker runs it
    from whatever it found, and a late checkpoint must not change what a later claim continues from.
    """
    table = cast(Table, BatchRequest.__table__)
    guard = (table.c.status == lifecycle.REQ_QUEUED) & table.c.lease_owner.is_(None)
    return _save(session, checkpoints, guard)


def _save(session: Session, checkpoints: Mapping[str, Sequence[int]], guard: Any) -> set[str]:
    rows = [{"c_id": rid, "c_blob": pack_tokens(ids), "c_count": len(ids)} for rid, ids in checkpoints.items() if ids]
    if not rows:
        return set()
    table = cast(Table, BatchRequest.__table__)
    statement = (
        table.update()
        .where(table.c.id == bindparam("c_id"), table.c.checkpoint_tokens < bindparam("c_count"), guard)
        .values(checkpoint=bindparam("c_blob"), checkpoint_tokens=bindparam("c_count"))
    )
    session.connection().execute(statement, rows)
    counts = {rid: len(ids) for rid, ids in checkpoints.items() if ids}
    stored = session.execute(
        select(BatchRequest.id, BatchRequest.checkpoint_tokens).where(ids_match(session, list(counts)), guard)
    ).all()
    return {rid for rid, count in stored if counts[rid] == count}


def still_open(session: Session, *, request_ids: Sequence[str]) -> set[str]:
    """The ids among these whose row is queued or running (its work will run again, not ended)."""
    if not request_ids:
        return set()
    statuses = (lifecycle.REQ_QUEUED, lifecycle.REQ_RUNNING)
    query = select(BatchRequest.id).where(ids_match(session, list(request_ids)), BatchRequest.status.in_(statuses))
    return set(session.scalars(query))
