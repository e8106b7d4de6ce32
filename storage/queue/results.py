"""Results: finished requests recorded, only while the worker still holds each row's lease.

Each request ends in exactly one result however often it ran: a result is stored only by the worker that still
holds the row's lease (storage/queue/leases.py). Reading results back is storage/queue/result_rows.py's.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any, cast

import orjson
from sqlalchemy import Table, bindparam, select, text
from sqlalchemy.orm import Session

from storage import lifecycle
from storage.clock import now_f
from storage.models import BatchRequest
from storage.queue.batch_counts import add_counts_of
from storage.queue.checkpoints import drop_ended
from storage.queue.enqueue import lock_batches_of
from storage.queue.handback import hand_back_paused
from storage.queue.spend_stops import stop_over_budget
from storage.settings import get_settings


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
    cached_tokens: int = 0
    reasoning_tokens: int = 0  # of completion_tokens: thinking
    check_attempts: dict[str, Any] | None = None  # a checked line's attempts (worker/feed/checks.py)


@dataclass(frozen=True)
class Recorded:
    """What `record_outcomes` did: {batch_id: results stored + requests a spend cap ended}, and which results landed."""

    batches: dict[str, int]
    stored: frozenset[str]


def record(session: Session, *, worker_id: str, run_id: str, outcomes: list[Outcome]) -> dict[str, int]:
    """Store finished requests this worker still holds; return {batch_id: results stored} (`record_outcomes`)."""
    return record_outcomes(session, worker_id=worker_id, run_id=run_id, outcomes=outcomes).batches


def record_outcomes(session: Session, *, worker_id: str, run_id: str, outcomes: list[Outcome]) -> Recorded:
    """Store finished requests this worker still holds; say which landed and which batches they changed.

    A result for a row that was cancelled, expired or re-leased meanwhile is dropped, so each request
    ends in exactly one line however often it ran; one for a row of a paused batch is dropped and the row
    handed back (`hand_back_paused`): a paused batch makes no progress. The batches are locked first (see
    `lock_batches_of`), then one UPDATE stores every result the lease check lets through and reports which rows took it.
    A batch whose spend cap is now reached has its queued requests ended (`stop_over_budget`); those
    batches (their tenant's others too) are in the answer, so a caller finalizes any with nothing open.
    The lock tells which batches are paused or capped: with none, those two steps send no statement.
    """
    if not outcomes:
        return Recorded({}, frozenset())
    ids = [o.request_id for o in outcomes]
    locked = lock_batches_of(session, request_ids=ids)
    if locked.paused and (paused := hand_back_paused(session, worker_id=worker_id, request_ids=ids)):
        outcomes = [o for o in outcomes if o.request_id not in paused]
        if not outcomes:
            return Recorded({}, frozenset())
    if session.get_bind().dialect.name == "postgresql":
        stored = _store_json(session, worker_id=worker_id, run_id=run_id, outcomes=outcomes)  # drops checkpoints too
    else:
        stored = _store_executemany(session, worker_id=worker_id, run_id=run_id, outcomes=outcomes)
        drop_ended(session, request_ids=[o.request_id for o in outcomes])  # their checkpoints resume nothing now
    counts: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for _, batch_id, status in stored:
        counts[batch_id][0 if status == lifecycle.REQ_COMPLETED else 1] += 1
    add_counts_of(session, {batch_id: (completed, failed) for batch_id, (completed, failed) in counts.items()})
    stored_counts = {batch_id: completed + failed for batch_id, (completed, failed) in counts.items()}
    capped = [batch_id for batch_id in stored_counts if batch_id in locked.capped]
    stopped = stop_over_budget(session, get_settings(), batch_ids=capped)  # spend caps: spend_stops.py
    batches = {b: stored_counts.get(b, 0) + stopped.get(b, 0) for b in stored_counts | stopped}
    return Recorded(batches, frozenset(row[0] for row in stored))


# A result moves a running row to completed or failed, checked against the table once, here: both statements
# below pick their rows by this status and set each row's own end status.
(_RESULT_FROM,) = lifecycle.request_move(lifecycle.REQ_RUNNING, to=(lifecycle.REQ_COMPLETED, lifecycle.REQ_FAILED))


def _final_status(outcome: Outcome) -> str:
    return lifecycle.REQ_COMPLETED if 200 <= outcome.status_code < 300 else lifecycle.REQ_FAILED


# Postgres: every result in one statement. The rows travel as one JSON document, the response bodies as a
# second one, a JSON array zipped to the rows by position: json_to_recordset would decode a body's escapes
# and refuse "\u0000" (which a model can emit), while json_array_elements hands each element over as json,
# verbatim.
# The same statement deletes the checkpoints of the rows it ended (`drop_ended`'s work: nothing resumes them
# now; chunks a write committed while it waited are the reaper's, storage/queue/checkpoints.py `sweep`); every
# other path that ends a row drops its own (storage/queue/batch_rows.py, reaping.py).
_STORE_JSON = text(
    """
    WITH stored AS (
    UPDATE batch_requests AS r SET
        status = v.status, response_status = v.code, response_body = b.body,
        error_code = v.error_code, error_message = v.error_message, prompt_tokens = v.prompt,
        completion_tokens = v.completion, cached_tokens = v.cached, reasoning_tokens = v.reasoning,
        engine_seconds = v.seconds, run_id = :run_id, check_attempts = v.attempts,
        lease_owner = NULL, lease_id = NULL, finished_at = :finished
    FROM ROWS FROM (json_to_recordset(CAST(:rows AS json)) AS (
            id text, status text, code int, error_code text, error_message text,
            prompt int, completion int, cached int, reasoning int, seconds float8, attempts json
        )) WITH ORDINALITY AS v(
            id, status, code, error_code, error_message, prompt, completion, cached, reasoning, seconds, attempts, n
        ),
        json_array_elements(CAST(:bodies AS json)) WITH ORDINALITY AS b(body, n)
    WHERE b.n = v.n AND r.id = v.id AND r.status = :from_status AND r.lease_owner = :worker_id
    RETURNING r.id, r.batch_id, r.status
    ), counted AS (
    DELETE FROM checkpoints AS c USING stored AS s WHERE c.request_id = s.id
    ), dropped AS (
    DELETE FROM checkpoint_chunks AS c USING stored AS s WHERE c.request_id = s.id
    )
    SELECT id, batch_id, status FROM stored
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
            "cached": o.cached_tokens,
            "reasoning": o.reasoning_tokens,
            "seconds": o.engine_seconds,
            "attempts": o.check_attempts,
        }
        for o in outcomes
    ]
    params = {
        "rows": orjson.dumps(rows).decode(),
        "bodies": (b"[" + b",".join(orjson.dumps(o.body) for o in outcomes) + b"]").decode(),
        "run_id": run_id,
        "finished": now_f(),
        "from_status": _RESULT_FROM,
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
            table.c.status == _RESULT_FROM,
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
            cached_tokens=bindparam("b_cached"),
            reasoning_tokens=bindparam("b_reasoning"),
            engine_seconds=bindparam("b_seconds"),
            check_attempts=bindparam("b_attempts", type_=table.c.check_attempts.type),
            run_id=run_id,
            lease_owner=None,
            lease_id=None,
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
                "b_cached": o.cached_tokens,
                "b_reasoning": o.reasoning_tokens,
                "b_seconds": o.engine_seconds,
                "b_attempts": o.check_attempts,
            }
            for o in outcomes
        ],
    )
    return list(
        session.execute(
            select(BatchRequest.id, BatchRequest.batch_id, BatchRequest.status).where(
                BatchRequest.id.in_([o.request_id for o in outcomes]),
                BatchRequest.run_id == run_id,
                BatchRequest.finished_at == finished,
            )
        ).all()
    )
