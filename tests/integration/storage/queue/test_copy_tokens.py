"""Tokens of a row continued in the background go to its copy (storage/queue/copy_tokens.py) only where the copy can
go on from them: never claimed, holding a prefix of them, waiting for the draw they are of."""

from __future__ import annotations

import json

import pytest
from sqlalchemy import select, update

from storage.db import transaction
from storage.models import Batch, BatchRequest
from storage.queue.checkpoints import Generated, save, stored_tokens
from storage.queue.copy_tokens import save_to_copies
from storage.queue.draws import Draws, draws_of, save_draws
from storage.queue.expiry import CONTINUE_IN_BACKGROUND
from tests.conftest import Backend
from tests.integration.storage.queue.test_checkpoints import _claim
from tests.integration.worker.feed.test_expiry_cuts import reap_once, window_closes
from tests.integration.worker.feed.test_runner import enqueue

pytestmark = pytest.mark.backfill_env({"BACKFILL_MODELS": json.dumps({"fake-model": {"path": "fake:"}})})


def continued(n: int) -> tuple[str, dict[str, str]]:
    """A batch of `n` lines, claimed by w1, then continued in the background: (its id, row id -> claim id)."""
    batch_id = enqueue(n, max_tokens=100)
    with transaction() as session:
        session.execute(update(Batch).where(Batch.id == batch_id).values(on_expiry=CONTINUE_IN_BACKGROUND))
    return batch_id, _claim("w1", limit=n)


def copy_of(request_id: str) -> str:
    with transaction() as session:
        return str(session.scalars(select(BatchRequest.id).where(BatchRequest.copy_of == request_id)).one())


def stored(request_id: str) -> list[int]:
    with transaction() as session:
        return stored_tokens(session, request_id=request_id)


def give(generated: dict[str, Generated], draws: dict[str, tuple[str, Draws]] | None = None) -> set[str]:
    with transaction() as session:
        return save_to_copies(session, generated=generated, draws=draws)


def test_a_copy_goes_on_from_the_tokens_its_origins_worker_held_past_the_last_checkpoint(backend: Backend) -> None:
    batch_id, claims = continued(1)
    (rid, claim_id), tokens = next(iter(claims.items())), list(range(30))
    with transaction() as session:
        save(session, checkpoints={rid: Generated(claim_id, tokens[:10])})
    window_closes(batch_id)
    reap_once()
    assert stored(copy_of(rid)) == tokens[:10]  # the continuation's checkpoint
    assert give({rid: Generated(claim_id, tokens)}) == {rid}
    assert stored(copy_of(rid)) == tokens


def test_a_copy_claimed_another_generation_or_another_draw_keeps_what_it_has(backend: Backend) -> None:
    batch_id, claims = continued(4)
    claimed, other, redrawn, checked = sorted(claims)
    with transaction() as session:
        save(session, checkpoints={other: Generated(claims[other], [7] * 10)})
        failed = Draws(({"attempt": 1, "check": "regex", "message": "no"},))
        save_draws(session, draws={rid: (claims[rid], failed) for rid in (redrawn, checked)})
    window_closes(batch_id)
    reap_once()
    with transaction() as session:  # another worker leased one copy: it runs it from what it found
        session.execute(
            update(BatchRequest)
            .where(BatchRequest.id == copy_of(claimed))
            .values(status="running", lease_owner="w2", claim_id="claim-of-w2")
        )
    generated = {
        claimed: Generated(claims[claimed], [1] * 20),
        other: Generated(claims[other], [8] * 20),  # not what the copy's checkpoint holds: another generation
        redrawn: Generated(claims[redrawn], [2] * 20, draw=2),  # a draw made after the continuation
        checked: Generated(claims[checked], [3] * 20, draw=1),  # the draw the copy makes next
    }
    assert give(generated) == {checked}
    assert stored(copy_of(claimed)) == [] and stored(copy_of(other)) == [7] * 10 and stored(copy_of(redrawn)) == []
    assert stored(copy_of(checked)) == [3] * 20
    assert give({checked: Generated("an-earlier-claim", [3] * 30, draw=1)}) == set()  # not the continued claim's


def test_a_copy_takes_the_draws_its_origins_worker_wrote_too_late_and_goes_on_with_the_next(backend: Backend) -> None:
    """The worker drew twice more before its writes of those draws reached the database, which had continued the
    line meanwhile: its copy holds the first draw's checkpoint and no draws; it gets both failed draws, and the
    third draw's tokens in place of that checkpoint, not another claim's."""
    batch_id, claims = continued(1)
    rid, claim_id = next(iter(claims.items()))
    with transaction() as session:
        save(session, checkpoints={rid: Generated(claim_id, [5] * 10)})  # the 1st draw's
    window_closes(batch_id)
    reap_once()
    copy = copy_of(rid)
    assert stored(copy) == [5] * 10
    failed = Draws(
        tuple({"attempt": n, "check": "regex", "message": "no"} for n in (1, 2)),
        {"prompt_tokens": 2, "completion_tokens": 30, "cached_tokens": 0},
    )
    third = {rid: Generated(claim_id, [6] * 4, draw=2)}
    assert give(third, {rid: ("an-earlier-claim", failed)}) == set()  # not the continued claim's draws
    assert stored(copy) == [5] * 10
    assert give(third, {rid: (claim_id, failed)}) == {rid}
    assert stored(copy) == [6] * 4
    with transaction() as session:
        row = session.get(BatchRequest, copy)
        assert row is not None and draws_of(row.draws).stored() == failed.stored()
