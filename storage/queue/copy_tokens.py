"""Tokens of a row continued in the background, handed to its copy (docs/workflow.md, "Partial answers at expiry").

The reaper continues an overdue batch at once (storage/batches/continuation.py): its open rows end `batch_expired`
and each copy in the child takes the row's last stored checkpoint, while the row's worker may still be generating
it, or hold its finished answer not yet stored. When that worker learns the row is gone (its result's write finds
the row ended, its renewal finds the lease lost) it hands what it generated to the copy here, so the child goes on
from there instead of decoding it again: all of it for a generation cut off, all but the last token of a finished
answer (the claim decodes that one again to end the generation, as after a pause: storage/queue/checkpoints.py).

A copy takes them only while nothing else can have moved it on: still queued and never claimed (a claim that leased
it runs from what it found), its checkpoint a prefix of these tokens (the same generation) and, for a checked line,
its stored draws those the tokens' draw follows. A checked line's failed draws written after the continuation (the
worker's write came too late for the copy to take them with the checkpoint) go to the copy first, in place of its
checkpoint (an earlier draw's), so it goes on with the next draw rather than drawing again from the first. The
guards hold in the update itself, so a claim racing the write either leases the copy first or finds the tokens there.
"""

from __future__ import annotations

from collections.abc import Mapping

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session, aliased

from storage import lifecycle
from storage.models import Batch, BatchRequest
from storage.queue import checkpoints
from storage.queue.checkpoints import Generated, load
from storage.queue.draws import Draws, draws_of


def save_to_copies(
    session: Session, *, generated: Mapping[str, Generated], draws: Mapping[str, tuple[str, Draws]] | None = None
) -> set[str]:
    """Hand the tokens of rows continued in the background (row id -> what its worker generated) to their copies
    where the guards allow (the module's docstring), after the failed draws of checked lines (row id -> the claim
    that made them, the draws) that their copies lack; return the ids of the rows whose copy took the tokens."""
    wanted = {rid: g for rid, g in generated.items() if g.token_ids and g.claim_id}
    drawn = {rid: made for rid, made in (draws or {}).items() if made[1].failed}
    if not wanted and not drawn:
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
            origin.id.in_(sorted(set(wanted) | set(drawn))),
            origin.status == lifecycle.REQ_EXPIRED,
            copy.status == lifecycle.REQ_QUEUED,
            copy.lease_owner.is_(None),
            copy.claim_id.is_(None),
        )
    ).all()
    taken: set[str] = set()
    for source, copy_id, count, stored, claim_id in rows:
        failed = len(draws_of(stored).failed)
        if (made := drawn.get(source)) is not None and made[0] == claim_id and len(made[1].failed) > failed:
            if not _advance(session, copy_id=copy_id, count=count, draws=made[1]):
                continue
            count, failed = 0, len(made[1].failed)
        if (mine := wanted.get(source)) is None or claim_id != mine.claim_id or failed != mine.draw:
            continue  # another generation's tokens, or another draw's
        tokens = list(mine.token_ids)
        if count >= len(tokens) or (count and load(session, counts={copy_id: count}).get(copy_id) != tokens[:count]):
            continue
        if _append(session, copy_id=copy_id, count=count, tokens=tokens):
            taken.add(source)
    return taken


def _advance(session: Session, *, copy_id: str, count: int, draws: Draws) -> bool:
    """Give the copy the draws its origin's worker made past those it holds (their write came after the
    continuation), dropping its checkpoint: an earlier draw's, which the next draw does not extend."""
    if not _hold_unclaimed(session, copy_id) or checkpoints.counts(session, request_ids=[copy_id])[copy_id] != count:
        return False
    session.execute(
        update(BatchRequest)
        .where(BatchRequest.id == copy_id)
        .values(draws=draws.stored())
        .execution_options(synchronize_session=False)
    )
    checkpoints.clear(session, request_ids=[copy_id])
    return True


def _hold_unclaimed(session: Session, copy_id: str) -> bool:
    """Lock the copy's queue row if it is still queued and never claimed; whether it was. A claim leases the row
    before it moves the checkpoint to itself, so while this transaction holds the row none can."""
    unclaimed = select(BatchRequest.id).where(
        BatchRequest.id == copy_id,
        BatchRequest.status == lifecycle.REQ_QUEUED,
        BatchRequest.lease_owner.is_(None),
        BatchRequest.claim_id.is_(None),
    )
    return session.scalar(unclaimed.with_for_update()) is not None


def _append(session: Session, *, copy_id: str, count: int, tokens: list[int]) -> bool:
    """Move the copy's checkpoint from `count` to the tokens' length where it is still unclaimed at `count`."""
    if not _hold_unclaimed(session, copy_id):
        return False
    return checkpoints.append_unclaimed(session, request_id=copy_id, count=count, tokens=tokens)
