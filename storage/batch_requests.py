"""The queue of record: claim with leases, renew, record results, release expired leases.

Every function here is one short statement group inside the caller's transaction; none is ever held
open across inference.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any, cast

import orjson
from sqlalchemy import ARRAY, String, Table, any_, bindparam, func, literal, select, text, update
from sqlalchemy.orm import Session

from storage import lifecycle
from storage.batches import add_counts
from storage.claim_order import ClaimOrder, claim_order, pick
from storage.clock import now_f
from storage.models import Batch, BatchRequest
from storage.settings import get_settings


@dataclass(frozen=True)
class ClaimedRequest:
    """A leased queue row, as the runner needs it."""

    id: str
    batch_id: str
    tenant_id: str
    url: str
    body: dict[str, Any]
    deadline: int
    # Inside the urgency horizon (see storage/claim_order.py): a worker holding urgent rows may ask for
    # more capacity (in shared mode, from online traffic) so they finish before their deadline.
    urgent: bool = False


@dataclass(frozen=True)
class Outcome:
    """A finished request as the runner reports it."""

    request_id: str
    status_code: int
    body: dict[str, Any]
    prompt_tokens: int
    completion_tokens: int
    engine_seconds: float
    error_code: str | None = None
    error_message: str | None = None


def claim(
    session: Session,
    *,
    model: str,
    worker_id: str,
    limit: int,
    lease_seconds: int,
    order: ClaimOrder | None = None,
) -> list[ClaimedRequest]:
    """Lease up to `limit` queued requests of `model`: urgent work first, then a fair share per tenant.

    Urgent rows (deadline inside the urgency horizon) go first, earliest deadline first across tenants;
    the rest is shared equally by tenant, grouped by prompt prefix within a deadline bucket (see
    storage/claim_order.py). Rows are locked with SKIP LOCKED, so concurrent workers never claim the same
    row. `order` defaults to the one the settings and the backlog give.
    """
    if limit <= 0:
        return []
    if order is None:
        order = claim_order(session, model=model, settings=get_settings())
    ids = pick(session, model=model, limit=limit, order=order)
    if not ids:
        return []
    return _lease(session, ids=ids, worker_id=worker_id, lease_seconds=lease_seconds, urgent_before=order.urgent_before)


def _lease(
    session: Session, *, ids: list[str], worker_id: str, lease_seconds: int, urgent_before: int = 0
) -> list[ClaimedRequest]:
    """Mark the picked rows running under this worker's lease and read them back in one statement."""
    rows = session.execute(
        update(BatchRequest)
        .where(_ids_match(session, ids))
        .values(
            status=lifecycle.REQ_RUNNING,
            lease_owner=worker_id,
            lease_expires_at=now_f() + lease_seconds,
            attempts=BatchRequest.attempts + 1,
        )
        .returning(
            BatchRequest.id,
            BatchRequest.batch_id,
            BatchRequest.tenant_id,
            BatchRequest.url,
            BatchRequest.body,
            BatchRequest.deadline,
        )
        .execution_options(synchronize_session=False)
    ).all()
    order = {request_id: index for index, request_id in enumerate(ids)}
    claimed = [
        ClaimedRequest(rid, batch_id, tenant_id, url, body, deadline, urgent=deadline <= urgent_before)
        for rid, batch_id, tenant_id, url, body, deadline in rows
    ]
    claimed.sort(key=lambda item: order[item.id])  # `ids` is already in claim order
    return claimed


def _ids_match(session: Session, ids: list[str]) -> Any:
    """`id IN (...)`; on Postgres one array parameter, so the statement text (and its plan) never varies."""
    if session.get_bind().dialect.name == "postgresql":
        return BatchRequest.id == any_(literal(ids, ARRAY(String)))
    return BatchRequest.id.in_(ids)


def renew(session: Session, *, worker_id: str, request_ids: list[str], lease_seconds: int) -> set[str]:
    """Extend this worker's leases; return the ids it no longer holds (cancelled, expired, re-queued)."""
    if not request_ids:
        return set()
    held = session.scalars(
        update(BatchRequest)
        .where(
            _ids_match(session, request_ids),
            BatchRequest.status == lifecycle.REQ_RUNNING,
            BatchRequest.lease_owner == worker_id,
        )
        .values(lease_expires_at=now_f() + lease_seconds)
        .returning(BatchRequest.id)
        .execution_options(synchronize_session=False)
    )
    return set(request_ids) - set(held)


def record(session: Session, *, worker_id: str, run_id: str, outcomes: list[Outcome]) -> dict[str, int]:
    """Store finished requests this worker still holds; return {batch_id: results stored}.

    A result for a row that was cancelled, expired or re-leased meanwhile is dropped, so each request
    ends in exactly one line however often it ran. The batches are locked first (see `lock_batches_of`),
    then one UPDATE stores every result the lease check lets through and reports which rows took it.
    """
    if not outcomes:
        return {}
    ids = [o.request_id for o in outcomes]
    lock_batches_of(session, request_ids=ids)
    if session.get_bind().dialect.name == "postgresql":
        stored = _store_json(session, worker_id=worker_id, run_id=run_id, outcomes=outcomes)
    else:
        stored = _store_executemany(session, worker_id=worker_id, run_id=run_id, outcomes=outcomes)
    counts: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for batch_id, status in stored:
        counts[batch_id][0 if status == lifecycle.REQ_COMPLETED else 1] += 1
    for batch_id, (completed, failed) in counts.items():
        add_counts(session, batch_id=batch_id, completed=completed, failed=failed)
    return {batch_id: completed + failed for batch_id, (completed, failed) in counts.items()}


def _final_status(outcome: Outcome) -> str:
    return lifecycle.REQ_COMPLETED if 200 <= outcome.status_code < 300 else lifecycle.REQ_FAILED


# Postgres: every result in one statement. The rows travel as one JSON document, except the response
# bodies: json_to_recordset decodes escapes and refuses "\u0000" (which a model can emit), so bodies go as a
# text[] (the json type keeps them verbatim) zipped to the rows by position.
_STORE_JSON = text(
    """
    UPDATE batch_requests AS r SET
        status = v.status, response_status = v.code, response_body = CAST(b.body AS json),
        error_code = v.error_code, error_message = v.error_message, prompt_tokens = v.prompt,
        completion_tokens = v.completion, engine_seconds = v.seconds, run_id = :run_id,
        lease_owner = NULL, lease_expires_at = NULL, finished_at = :finished
    FROM ROWS FROM (json_to_recordset(CAST(:rows AS json)) AS (
            id text, status text, code int, error_code text, error_message text,
            prompt int, completion int, seconds float8
        )) WITH ORDINALITY AS v(id, status, code, error_code, error_message, prompt, completion, seconds, n),
        unnest(CAST(:bodies AS text[])) WITH ORDINALITY AS b(body, n)
    WHERE b.n = v.n AND r.id = v.id AND r.status = :running AND r.lease_owner = :worker_id
    RETURNING r.batch_id, r.status
    """
)


def _store_json(session: Session, *, worker_id: str, run_id: str, outcomes: list[Outcome]) -> list[Any]:
    rows = [
        {
            "id": o.request_id,
            "status": _final_status(o),
            "code": o.status_code,
            "error_code": o.error_code,
            "error_message": o.error_message.replace("\x00", "\ufffd") if o.error_message else o.error_message,
            "prompt": o.prompt_tokens,
            "completion": o.completion_tokens,
            "seconds": o.engine_seconds,
        }
        for o in outcomes
    ]
    params = {
        "rows": orjson.dumps(rows).decode(),
        "bodies": [orjson.dumps(o.body).decode() for o in outcomes],
        "run_id": run_id,
        "finished": now_f(),
        "running": lifecycle.REQ_RUNNING,
        "worker_id": worker_id,
    }
    return list(session.execute(_STORE_JSON, params).all())


def _store_executemany(session: Session, *, worker_id: str, run_id: str, outcomes: list[Outcome]) -> list[Any]:
    """Other databases: one executemany UPDATE, then a read-back of the rows now carrying this stamp."""
    finished = now_f()
    table = cast(Table, BatchRequest.__table__)
    statement = (
        table.update()
        .where(
            table.c.id == bindparam("b_id"),
            table.c.status == lifecycle.REQ_RUNNING,
            table.c.lease_owner == worker_id,
        )
        .values(
            status=bindparam("b_status"),
            response_status=bindparam("b_code"),
            response_body=bindparam("b_body", type_=table.c.response_body.type),
            error_code=bindparam("b_error_code"),
            error_message=bindparam("b_error_message"),
            prompt_tokens=bindparam("b_prompt"),
            completion_tokens=bindparam("b_completion"),
            engine_seconds=bindparam("b_seconds"),
            run_id=run_id,
            lease_owner=None,
            lease_expires_at=None,
            finished_at=finished,
        )
    )
    session.connection().execute(
        statement,
        [
            {
                "b_id": o.request_id,
                "b_status": _final_status(o),
                "b_code": o.status_code,
                "b_body": o.body,
                "b_error_code": o.error_code,
                "b_error_message": o.error_message,
                "b_prompt": o.prompt_tokens,
                "b_completion": o.completion_tokens,
                "b_seconds": o.engine_seconds,
            }
            for o in outcomes
        ],
    )
    return list(
        session.execute(
            select(BatchRequest.batch_id, BatchRequest.status).where(
                BatchRequest.id.in_([o.request_id for o in outcomes]),
                BatchRequest.run_id == run_id,
                BatchRequest.finished_at == finished,
            )
        ).all()
    )


def lock_batches_of(session: Session, *, request_ids: list[str]) -> None:
    """Lock the batches of these requests, in id order, before touching the requests themselves.

    Every transaction that changes both a batch and its requests takes the batch first (cancel, expiry,
    finalize, recording results), so they can wait on each other but never deadlock.
    """
    batch_ids = select(BatchRequest.batch_id).where(_ids_match(session, request_ids)).distinct()
    session.execute(select(Batch.id).where(Batch.id.in_(batch_ids)).order_by(Batch.id).with_for_update()).all()


def release_expired_leases(session: Session, *, max_attempts: int) -> int:
    """Put requests whose worker vanished back in the queue (or fail them after `max_attempts`)."""
    expired = (BatchRequest.status == lifecycle.REQ_RUNNING, BatchRequest.lease_expires_at < now_f())
    doomed = list(session.scalars(select(BatchRequest.id).where(*expired, BatchRequest.attempts >= max_attempts)))
    if doomed:
        lock_batches_of(session, request_ids=doomed)
    give_up = (
        session.execute(
            update(BatchRequest)
            .where(*expired, BatchRequest.attempts >= max_attempts)
            .values(
                status=lifecycle.REQ_FAILED,
                response_status=500,
                error_code="engine_error",
                error_message=f"The request was interrupted {max_attempts} times; giving up.",
                lease_owner=None,
                lease_expires_at=None,
                finished_at=now_f(),
            )
            .returning(BatchRequest.batch_id)
            .execution_options(synchronize_session=False)
        )
        .scalars()
        .all()
    )
    for batch_id in give_up:
        add_counts(session, batch_id=batch_id, completed=0, failed=1)
    requeued = session.execute(
        update(BatchRequest)
        .where(*expired)
        .values(status=lifecycle.REQ_QUEUED, lease_owner=None, lease_expires_at=None)
        .execution_options(synchronize_session=False)
    )
    return int(requeued.rowcount or 0) + len(give_up)  # type: ignore[attr-defined]


def open_count(session: Session, *, batch_id: str) -> int:
    """How many of the batch's requests are still queued or running."""
    return int(
        session.scalar(
            select(func.count())
            .select_from(BatchRequest)
            .where(BatchRequest.batch_id == batch_id, BatchRequest.status.in_(lifecycle.REQ_OPEN))
        )
        or 0
    )


def batches_ready_to_finalize(session: Session) -> list[str]:
    """Ids of running/cancelling batches with no open requests left (finalize picks them up)."""
    open_exists = (
        select(BatchRequest.id)
        .where(BatchRequest.batch_id == Batch.id, BatchRequest.status.in_(lifecycle.REQ_OPEN))
        .exists()
    )
    query = select(Batch.id).where(
        Batch.status.in_((lifecycle.IN_PROGRESS, lifecycle.CANCELLING, lifecycle.FINALIZING)), ~open_exists
    )
    return list(session.scalars(query))


def has_queued(session: Session, *, model: str) -> bool:
    """True if any request of `model` waits in the queue."""
    query = (
        select(BatchRequest.id).where(BatchRequest.model == model, BatchRequest.status == lifecycle.REQ_QUEUED).limit(1)
    )
    return session.scalar(query) is not None


def release(session: Session, *, worker_id: str, request_ids: list[str]) -> int:
    """Hand this worker's leased requests back to the queue unrun (a model switch); the attempt is not counted."""
    if not request_ids:
        return 0
    released = session.execute(
        update(BatchRequest)
        .where(
            BatchRequest.id.in_(request_ids),
            BatchRequest.status == lifecycle.REQ_RUNNING,
            BatchRequest.lease_owner == worker_id,
        )
        .values(
            status=lifecycle.REQ_QUEUED,
            lease_owner=None,
            lease_expires_at=None,
            attempts=BatchRequest.attempts - 1,
        )
        .execution_options(synchronize_session=False)
    )
    return int(released.rowcount or 0)  # type: ignore[attr-defined]
