"""Retries: a new batch that re-runs only the failed requests of an ended batch, keeping its successes.

A retry copies the failed requests' queue rows (same line number, custom_id and body) under a new batch
linked to its origin by `retry_of` (and to its tree's original by `retry_root`); it is queued at once (the
lines were validated when the origin was). A success is never copied, so it is never run or billed again.
The merged view reads a batch and every retry below it, each line once, from the latest attempt that finished
it. Both cost what the lines they return cost, not the tree's size (storage/queue/retry_rows.py), and a tree
holds at most `retry_max_attempts` retries.

Retried by default: requests that ended because their batch expired or was cancelled (`batch_expired`,
`batch_cancelled`), the budget stopped it (`budget_exceeded`) or the engine or server failed (a 5xx or no
response). Client errors (`context_length_exceeded`, bad parameters, 4xx) only when named in `codes`, by the
code the batch's protocol shows its users (storage/protocols.py `error_kind`).

A retry keeps its origin's spend cap (what is left of it after what the origin and its retries were billed)
and its priority (within the tenant's cap today), unless the caller sets its own.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from storage import lifecycle
from storage.batches.batches import create_batch, get_batch
from storage.batches.checks import attach_workflow
from storage.batches.control import MIN_PRIORITY, check_priority
from storage.errors import BatchNotRetryable, BudgetExceeded, NothingToRetry, RetryLimitReached
from storage.finance.budgets import MICRO, batch_spend, check_month_not_spent, usd, usd_text
from storage.models import Batch
from storage.protocols import Protocol, protocol_of
from storage.queue.batch_rows import queued_models
from storage.queue.retry_rows import Failure, latest_failures, requeue_copies
from storage.quotas import quota_of
from storage.settings import Settings
from storage.wakeups import wake_after_commit

RETRYABLE_CODES = frozenset({"batch_expired", "batch_cancelled", "budget_exceeded"})
_ENDED = (lifecycle.COMPLETED, lifecycle.EXPIRED, lifecycle.CANCELLED)
_COPY_CHUNK = 2000
INHERITED_CAP = "max_cost_inherited"


@dataclass(frozen=True)
class RetryChoices:
    """What the caller of a retry chose: extra `codes` to re-run, and the retry's own priority and spend cap
    (`own_cap`: whether `max_cost_micro_usd` was given at all; None then means no cap)."""

    codes: frozenset[str] = frozenset()
    priority: int | None = None
    own_cap: bool = False
    max_cost_micro_usd: int | None = None


def is_retryable(failure: Failure, *, codes: frozenset[str], protocol: Protocol) -> bool:
    """Whether a request's latest attempt is an error line a retry re-runs (`codes`: named extra codes, in the
    protocol's own words or Backfill's)."""
    _, status, status_code, error_code = failure
    if status == lifecycle.REQ_COMPLETED:
        return False
    if status in (lifecycle.REQ_EXPIRED, lifecycle.REQ_CANCELLED) or error_code in RETRYABLE_CODES:
        return True
    if status_code is None or status_code >= 500:
        return True
    return error_code in codes or protocol.error_kind(status_code, error_code) in codes


def retry_batch(
    session: Session, settings: Settings, *, tenant_id: str, batch_id: str, protocol: Protocol, choices: RetryChoices
) -> Batch:
    """Create and queue a retry of an ended batch: its requests whose latest attempt (over the batch and its
    retries) is a retryable error line. BatchNotRetryable (409) while any of the tree runs or past the tree's
    retry limit; NothingToRetry (400); BudgetExceeded while the tenant's month is spent. Everything is read first;
    the tree's lock is taken only to write. The models it queued work for are woken after commit."""
    check_month_not_spent(session, settings, tenant_id=tenant_id, what="a retry")
    origin = get_batch(session, tenant_id=tenant_id, batch_id=batch_id, protocol=protocol)
    tree = retry_tree(session, batch=origin)
    _check_can_retry(origin, tree, settings)
    ids = _failed_ids(session, origin=origin, tree=tree, codes=choices.codes)
    priority = _priority(session, settings, origin=origin, choices=choices)
    cap, note = _cap(session, settings, origin=origin, tree=tree, choices=choices)
    root = get_batch(session, tenant_id=None, batch_id=tree[0].id, lock=True)  # one retry at a time per tree
    if [(b.id, b.status) for b in retry_tree(session, batch=root, fresh=True)] != [(b.id, b.status) for b in tree]:
        raise BatchNotRetryable(f"Batch {origin.id}'s retry tree changed while this retry was prepared; try again.")
    retry = create_batch(
        session,
        tenant_id=tenant_id,
        input_file_id=origin.input_file_id,
        endpoint=origin.endpoint,
        completion_window=origin.completion_window,
        model=origin.model,
        metadata=origin.metadata_,
        output_expires_after_seconds=origin.output_expires_after_seconds,
        protocol=protocol_of(origin),
        priority=priority,
        max_cost_micro_usd=cap,
    )
    retry.retry_of, retry.retry_root = origin.id, root.id
    attach_workflow(retry, trial=None, checks=origin.checks)  # its answers are checked as the origin's were
    retry.attempt = max(batch.attempt for batch in tree) + 1
    retry.warnings = [note] if note else None
    total = sum(requeue_copies(session, batch=retry, root_id=root.id, request_ids=chunk) for chunk in _chunks(ids))
    if not total:
        raise NothingToRetry(_nothing(origin), param="codes")
    retry.request_total = total
    lifecycle.transition(retry, lifecycle.IN_PROGRESS)
    session.flush()
    for model in queued_models(session, batch_id=retry.id):
        wake_after_commit(session, "batch.run", model=model)
    return retry


def _check_can_retry(origin: Batch, tree: list[Batch], settings: Settings) -> None:
    running = [batch for batch in tree if batch.status not in _ENDED and batch.status != lifecycle.FAILED]
    if origin.status not in _ENDED or running:
        protocol = protocol_of(origin)
        shown = f"its {protocol.status_field} is '{protocol.shown_status(origin.status)}'"
        what = shown if origin.status not in _ENDED else f"has a retry {running[0].id} still running"
        raise BatchNotRetryable(
            f"Batch {origin.id} {what}: only an ended batch whose retries have ended can be retried."
        )
    if origin.archived_at is not None:
        raise BatchNotRetryable(f"The requests of batch {origin.id} were archived: it can no longer be retried.")
    retries = max(batch.attempt for batch in tree)
    if retries >= settings.retry_max_attempts:
        raise RetryLimitReached(
            f"Batch {origin.id}'s retry tree already holds {retries} retries, the most this server allows "
            f"(BACKFILL_RETRY_MAX_ATTEMPTS={settings.retry_max_attempts}). Create a new batch from the lines that "
            "still fail (the merged view, `GET /v1/batches/{id}/results?merged=true`, lists them)."
        )


def _failed_ids(session: Session, *, origin: Batch, tree: list[Batch], codes: frozenset[str]) -> list[str]:
    lines_of = None if origin.id == tree[0].id else origin.id
    protocol = protocol_of(origin)
    failures = latest_failures(session, tree=[batch.id for batch in tree], lines_of=lines_of)
    ids = [failure[0] for failure in failures if is_retryable(failure, codes=codes, protocol=protocol)]
    if not ids:
        raise NothingToRetry(_nothing(origin), param="codes")
    return ids


def _nothing(origin: Batch) -> str:
    return (
        f"No request of batch {origin.id} ended as an error line a retry re-runs "
        f"(by default: batch_expired, batch_cancelled, budget_exceeded and server errors; name client "
        f"error codes in `codes`)."
    )


def _priority(session: Session, settings: Settings, *, origin: Batch, choices: RetryChoices) -> int:
    """The caller's priority (within the tenant's cap), else the origin's, lowered to the tenant's cap today."""
    if choices.priority is not None:
        return check_priority(session, settings, tenant_id=origin.tenant_id, priority=choices.priority)
    cap = quota_of(session, settings, tenant_id=origin.tenant_id).max_priority
    return max(MIN_PRIORITY, min(origin.priority, cap))


def _cap(
    session: Session, settings: Settings, *, origin: Batch, tree: list[Batch], choices: RetryChoices
) -> tuple[int | None, dict[str, Any] | None]:
    """The retry's spend cap in micro-dollars, and the warning that says where an inherited one came from:
    the caller's own, else what is left of the origin's after the origin and its retries were billed."""
    if choices.own_cap or origin.max_cost_micro_usd is None:
        return choices.max_cost_micro_usd, None
    cap = usd(origin.max_cost_micro_usd)
    spent = sum((batch_spend(session, settings, batch=b) for b in retry_family(tree, batch=origin)), Decimal(0))
    left = (cap - spent).quantize(MICRO)
    if left <= 0:
        raise BudgetExceeded(
            f"Batch {origin.id}'s max_cost_usd of ${usd_text(cap)} is spent (${usd_text(spent)} billed over it and "
            "its retries): a retry inheriting it could run nothing. Pass max_cost_usd to give the retry its own cap.",
            param="max_cost_usd",
        )
    note = {
        "code": INHERITED_CAP,
        "message": f"max_cost_usd ${usd_text(left)} is inherited: what is left of batch {origin.id}'s cap of "
        f"${usd_text(cap)} after ${usd_text(spent)} billed over it and its retries (a retry never spends the cap "
        "again). Pass max_cost_usd on the retry to set its own.",
        "param": "max_cost_usd",
        "line": None,
    }
    return int(left / MICRO), note


def inherited_cap(
    session: Session, settings: Settings, *, origin: Batch, tree: list[Batch], choices: RetryChoices
) -> tuple[int | None, dict[str, Any] | None]:
    """A new member of the tree's spend cap (what is left of the origin's) and the note saying so (`_cap`)."""
    return _cap(session, settings, origin=origin, tree=tree, choices=choices)


def _chunks(ids: list[str]) -> Iterator[list[str]]:
    for start in range(0, len(ids), _COPY_CHUNK):
        yield ids[start : start + _COPY_CHUNK]


def retry_tree(session: Session, *, batch: Batch, fresh: bool = False) -> list[Batch]:
    """The whole retry tree the batch belongs to (its original batch and every retry in it, deleted ones too),
    in attempt order: one indexed read. `fresh`: re-read rows this session already holds."""
    root = batch.retry_root or batch.id
    query = select(Batch).where((Batch.id == root) | (Batch.retry_root == root)).order_by(Batch.attempt)
    if fresh:
        query = query.execution_options(populate_existing=True)
    return list(session.scalars(query))


def retry_family(tree: list[Batch], *, batch: Batch) -> list[Batch]:
    """The batch and every retry below it (retries of retries too) among its tree, in attempt order."""
    family, frontier = [batch], {batch.id}
    for member in tree:  # attempt order: a retry always comes after its origin
        if member.retry_of in frontier:
            family.append(member)
            frontier.add(member.id)
    return family


def retry_ids_of(session: Session, *, batch_ids: list[str]) -> dict[str, list[str]]:
    """{batch_id: its direct retries' ids, oldest first} for a page of batches (one query)."""
    found: dict[str, list[str]] = {batch_id: [] for batch_id in batch_ids}
    if not batch_ids:
        return found
    query = select(Batch.retry_of, Batch.id).where(Batch.retry_of.in_(batch_ids)).order_by(Batch.created_at, Batch.id)
    for origin, retry in session.execute(query).all():
        if origin is not None:
            found[origin].append(retry)
    return found
