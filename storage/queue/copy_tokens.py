"""Tokens of a row continued in the background, handed to its copy (docs/workflow.md, "Partial answers at expiry").

The reaper continues an overdue batch at once (storage/batches/continuation.py): its open rows end `batch_expired`
and each copy in the child takes the row's last stored checkpoint, while the row's worker may still be generating
it, or hold its finished answer not yet stored. When that worker learns the row is gone (its result's write finds
the row ended, its renewal finds the lease lost) it hands what it generated to the copy here, so the child goes on
from there instead of decoding it again: all of it for a generation cut off, all but the last token of a finished
answer (the claim decodes that one again to end the generation, as after a pause: storage/queue/checkpoints.py).

A copy takes them only while nothing else can have moved it on: still queued and never claimed (a claim that leased
it runs from what it found), its checkpoint a prefix of these tokens (the same generation) and, for a checked line,
its stored draws those the tokens' draw follows (a worker that drew again after the continuation holds another
draw's tokens). The guards hold in the update itself, so a claim racing the write either leases the copy first or
finds the tokens there.
"""

from __future__ import annotations

from collections.abc import Mapping

from sqlalchemy import func, insert, select, update
from sqlalchemy.orm import Session, aliased

from storage import lifecycle
from storage.models import Batch, BatchRequest, CheckpointChunk
from storage.queue.checkpoints import Generated, load, pack_tokens
from storage.queue.draws import draws_of


def save_to_copies(session: Session, *, generated: Mapping[str, Generated]) -> set[str]:
    """Hand the tokens of rows continued in the background (row id -> what its worker generated) to their copies
    where the guards allow (the module's docstring); return the ids of the rows whose copy took them."""
    wanted = {rid: g for rid, g in generated.items() if g.token_ids and g.claim_id}
    if not wanted:
        return set()
    origin, root = aliased(BatchRequest), aliased(BatchRequest)
    copy = BatchRequest
    rows = session.execute(
        select(origin.id, copy.id, copy.checkpoint_tokens, copy.draws, origin.claim_id)
        .select_from(origin)
        .join(Batch, Batch.id == origin.batch_id)
        .join(root, (root.batch_id == func.coalesce(Batch.retry_root, Batch.id)) & (root.line == origin.line))
        .join(copy, (copy.id == root.latest_copy) & (copy.copy_of == origin.id))
        .where(
            origin.id.in_(sorted(wanted)),
            origin.status == lifecycle.REQ_EXPIRED,
            copy.status == lifecycle.REQ_QUEUED,
            copy.lease_owner.is_(None),
            copy.claim_id.is_(None),
        )
    ).all()
    taken: set[str] = set()
    for source, copy_id, count, draws, claim_id in rows:
        tokens = list(wanted[source].token_ids)
        if claim_id != wanted[source].claim_id or len(draws_of(draws).failed) != wanted[source].draw:
            continue  # another generation's tokens, or another draw's
        if count >= len(tokens) or (count and load(session, counts={copy_id: count}).get(copy_id) != tokens[:count]):
            continue
        if _append(session, copy_id=copy_id, count=count, tokens=tokens):
            taken.add(source)
    return taken


def _append(session: Session, *, copy_id: str, count: int, tokens: list[int]) -> bool:
    """Move the copy's checkpoint from `count` to the tokens' length where it is still unclaimed at `count`."""
    moved = session.scalar(
        update(BatchRequest)
        .where(
            BatchRequest.id == copy_id,
            BatchRequest.status == lifecycle.REQ_QUEUED,
            BatchRequest.lease_owner.is_(None),
            BatchRequest.claim_id.is_(None),
            BatchRequest.checkpoint_tokens == count,
        )
        .values(checkpoint_tokens=len(tokens))
        .returning(BatchRequest.id)
        .execution_options(synchronize_session=False)
    )
    if moved is not None:
        session.execute(
            insert(CheckpointChunk), [{"request_id": copy_id, "start": count, "token_ids": pack_tokens(tokens[count:])}]
        )
    return moved is not None
