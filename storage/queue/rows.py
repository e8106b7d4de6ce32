"""Queue rows: id matching and the batch-before-request lock order shared by every queue statement."""

from __future__ import annotations

from typing import Any

from sqlalchemy import ARRAY, String, any_, literal, select
from sqlalchemy.orm import Session

from storage.models import Batch, BatchRequest


def _ids_match(session: Session, ids: list[str]) -> Any:
    """`id IN (...)`; on Postgres one array parameter, so the statement text (and its plan) never varies."""
    if session.get_bind().dialect.name == "postgresql":
        return BatchRequest.id == any_(literal(ids, ARRAY(String)))
    return BatchRequest.id.in_(ids)


def lock_batches_of(session: Session, *, request_ids: list[str]) -> None:
    """Lock the batches of these requests, in id order, before touching the requests themselves.

    Every transaction that changes both a batch and its requests takes the batch first (cancel, expiry,
    finalize, recording results), so they can wait on each other but never deadlock.
    """
    batch_ids = select(BatchRequest.batch_id).where(_ids_match(session, request_ids)).distinct()
    session.execute(select(Batch.id).where(Batch.id.in_(batch_ids)).order_by(Batch.id).with_for_update()).all()
