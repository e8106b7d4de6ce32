"""Anthropic Message Batches: rows of the shared `batches` table of the Anthropic protocol (storage/protocols.py).

Everything that watches batches (ingest, the queue, leases, finalize, the reaper, cost accounting, goodput,
finance reports) treats them like OpenAI batches; this module only adds what Anthropic's API says
differently: the create body streamed into an internal input file (its Backfill extensions beside `requests`,
the completion window among them, checked as an OpenAI create's are: storage/batches/creation.py), the same body's
dry run (`estimate_message_batch`: OpenAI's estimate and window menu, nothing stored), newest-first paging both
ways, one results file, deletion once ended, and archival after the retention. How a row reads as Anthropic's
`MessageBatch` (`processing_status`, `request_counts`) is the API's view of it: api/anthropic/status.py.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from storage import lifecycle
from storage.adapters.registry import adapter_bases
from storage.batches.archive import drop_content
from storage.batches.batches import create_batch, get_batch
from storage.batches.checks import attach_workflow, checks_spec
from storage.batches.creation import check_extensions, check_served, check_window, on_expiry_spec
from storage.batches.estimates import Estimate, estimate_job
from storage.batches.trials import trial_spec
from storage.clock import now
from storage.endpoints import MESSAGES_URL
from storage.errors import InvalidRequest, NotFound
from storage.files.blobs import BlobStore
from storage.files.blobs.layout import input_file_key
from storage.files.files import create_file, tenant_folder
from storage.finance.budgets import check_file_within_budget
from storage.ids import new_id
from storage.lines.anthropic import RequestsReader, unqueued_results
from storage.lines.reader import clip
from storage.models import Batch, File
from storage.paging import keyset_page
from storage.planning.shapes import shape_of_jsonl
from storage.protocols import ANTHROPIC
from storage.settings import Settings
from storage.strict import parse_usd, priority_value
from storage.wakeups import wake_after_commit

INPUT_PURPOSE = "message_batch_input"
RESULTS_PURPOSE = "message_batch_results"
WINDOW = "24h"  # Anthropic's processing window: a create's default (a Backfill extension names another)

# What an ended batch's requests became when it ended before any was queued (Anthropic result types).
_UNQUEUED_OUTCOME = {lifecycle.CANCELLED: "canceled", lifecycle.EXPIRED: "expired", lifecycle.FAILED: "errored"}


class NotEnded(InvalidRequest):
    """Results and deletion wait until a batch has ended."""

    code = "batch_not_ended"


class ResultsArchived(NotFound):
    """The results passed their retention and were removed (the batch itself stays visible)."""

    code = "results_archived"


def create_message_batch(
    session: Session, blobs: BlobStore, settings: Settings, *, tenant_id: str, chunks: Iterable[bytes]
) -> Batch:
    """Stream a create body into an internal input file, checking every request's shape; record the batch.

    The body is never held whole: each request is written on as one JSONL line as it arrives. A shape
    problem anywhere fails the whole create (400 naming every bad request) and removes the partial object.
    Ingest is woken after commit.
    """
    reader = _reader(settings)
    file_id = new_id("file-")
    try:
        source = create_file(
            session,
            blobs,
            tenant_id=tenant_id,
            filename="message_batch_requests.jsonl",
            purpose=INPUT_PURPOSE,
            chunks=reader.lines(chunks),
            file_id=file_id,
        )
        reader.raise_if_bad()
        window = check_window(settings, reader.extensions.get("completion_window", WINDOW))
        priority, cap = _extensions(session, settings, tenant_id=tenant_id, given=reader.extensions)
        on_expiry = on_expiry_spec(settings, reader.extensions.get("on_expiry"), completion_window=window)
        trial, checks = _workflow(settings, given=reader.extensions)
        model = None if reader.mixed_models else reader.first_model
        check_file_within_budget(
            session,
            blobs,
            settings,
            tenant_id=tenant_id,
            blob_key=source.blob_key,
            endpoint=MESSAGES_URL,
            model=model,
            completion_window=window,
        )
    except BaseException:
        blobs.delete(input_file_key(tenant=tenant_folder(session, tenant_id=tenant_id), file_id=file_id))
        raise
    batch = create_batch(
        session,
        tenant_id=tenant_id,
        input_file_id=source.id,
        endpoint=MESSAGES_URL,
        completion_window=window,
        model=None if reader.mixed_models else reader.first_model,  # None: each request names its own
        metadata=None,
        protocol=ANTHROPIC,
        priority=priority,
        max_cost_micro_usd=cap,
    )
    batch.request_total = reader.count
    attach_workflow(batch, trial=trial, checks=checks)
    batch.on_expiry = on_expiry
    session.flush()
    wake_after_commit(session, "batch.ingest", batch_id=batch.id)
    return batch


def estimate_message_batch(
    session: Session, settings: Settings, *, tenant_id: str, chunks: Iterable[bytes]
) -> Estimate:
    """The dry run of `create_message_batch`: the same body read by the same bounded reader, nothing stored; the
    job's cost, start and finish behind the backlog and the menu of every offered window, as OpenAI's estimate
    (`estimate_job`). One model per estimate: the menu is admission's projection of that model's queue."""
    reader = _reader(settings)
    adapters = adapter_bases(session, settings, tenant_id=tenant_id)
    shape = shape_of_jsonl(
        reader.lines(chunks),
        endpoint=MESSAGES_URL,
        max_line_bytes=settings.line_max_bytes,
        max_requests=settings.message_batch_max_requests,
        default_models=settings.default_models(),
        adapters=adapters,
        max_adapters=settings.batch_max_adapters,
    )
    reader.raise_if_bad()
    window = check_window(settings, reader.extensions.get("completion_window", WINDOW))
    _priority_and_cap(reader.extensions)  # malformed ones are the create's 400 (the tenant's cap is judged there)
    if reader.mixed_models:
        raise InvalidRequest(
            "An estimate covers one model, and these requests name more than one (the first: "
            f"{clip(reader.first_model)}): estimate each model's requests on their own.",
            param="requests",
        )
    model = check_served(settings, shape.model, endpoint=MESSAGES_URL, adapters=adapters)
    if model is None:
        raise InvalidRequest("The requests name no model.", param="requests")
    return estimate_job(
        session, model=model, shape=shape, settings=settings, completion_window=window, tenant_id=tenant_id
    )


def _reader(settings: Settings) -> RequestsReader:
    return RequestsReader(
        max_requests=settings.message_batch_max_requests,
        max_request_bytes=settings.line_max_bytes,
        max_body_bytes=settings.message_batch_max_bytes,
    )


def _extensions(
    session: Session, settings: Settings, *, tenant_id: str, given: dict[str, Any]
) -> tuple[int, int | None]:
    """The create's Backfill extensions beside `requests` (as OpenAI's `extra_body` carries them): the priority
    (checked against the tenant's cap) and the spend cap in micro-dollars."""
    priority, cap = _priority_and_cap(given)
    return priority, check_extensions(session, settings, tenant_id=tenant_id, priority=priority, max_cost_micro_usd=cap)


def _priority_and_cap(given: dict[str, Any]) -> tuple[int, int | None]:
    """The priority and the spend cap (micro-dollars) given, by the same strict rules as OpenAI's create body."""
    priority = priority_value(given.get("priority", 0))
    cost = given.get("max_cost_usd")
    return priority, None if cost is None else parse_usd(cost, param="max_cost_usd")


def _workflow(settings: Settings, *, given: dict[str, Any]) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """The create's trial and checks beside `requests` (docs/workflow.md), checked as an OpenAI create's are."""
    trial, checks = given.get("trial"), given.get("checks")
    return (
        None if trial is None else trial_spec(trial, max_lines=settings.trial_max_lines),
        None if checks is None else checks_spec(checks, endpoint=MESSAGES_URL),
    )


def get_message_batch(session: Session, *, tenant_id: str, batch_id: str, lock: bool = False) -> Batch:
    """The tenant's live Anthropic batch, or BatchNotFound."""
    return get_batch(session, tenant_id=tenant_id, batch_id=batch_id, lock=lock, protocol=ANTHROPIC)


def list_message_batches(
    session: Session, *, tenant_id: str, before_id: str | None, after_id: str | None, limit: int
) -> tuple[list[Batch], bool]:
    """A page of the tenant's batches, newest first, and whether more lie beyond it in paging direction.

    `after_id`: the page of older batches right after that one; `before_id`: the newer ones right before it.
    """
    if before_id and after_id:
        raise InvalidRequest("Give at most one of before_id and after_id.", param="before_id")
    query = select(Batch).where(
        Batch.tenant_id == tenant_id, Batch.protocol == ANTHROPIC.name, Batch.deleted_at.is_(None)
    )
    cursor = before_id or after_id
    anchor = None
    if cursor:
        found = session.get(Batch, cursor)  # a deleted batch still marks its place
        if found is None or found.tenant_id != tenant_id or not ANTHROPIC.owns(found.protocol):
            param = "before_id" if before_id else "after_id"
            raise InvalidRequest(f"No message batch found with id {clip(cursor, 64)}.", param=param)
        anchor = (found.created_at, found.id)
    key = (Batch.created_at, Batch.id)
    rows = keyset_page(session, query, key=key, anchor=anchor, limit=limit, before=bool(before_id))
    page = rows[:limit]
    return (list(reversed(page)) if before_id else page), len(rows) > limit


def unqueued_outcome(batch: Batch) -> str | None:
    """The result type (canceled, expired, errored) of an ended batch's requests that were never queued; None
    while it runs."""
    return _UNQUEUED_OUTCOME.get(batch.status)


def results_stream(session: Session, blobs: BlobStore, settings: Settings, *, batch: Batch) -> Iterator[bytes]:
    """The ended batch's results JSONL, streamed from object storage (read no database while streaming)."""
    _require_ended(batch)
    if batch.archived_at is not None:
        raise ResultsArchived(
            f"The results of Message Batch {batch.id} were archived and are no longer available "
            f"(kept {settings.message_batch_retention_seconds // 86400} days after the batch ended)."
        )
    chunk = settings.stream_chunk_bytes
    results = session.get(File, batch.output_file_id) if batch.output_file_id is not None else None
    if results is not None:
        return blobs.open_stream(results.blob_key, chunk_bytes=chunk)
    source = session.get(File, batch.input_file_id)
    if source is None or source.deleted_at is not None or batch.request_completed + batch.request_failed:
        return iter(())  # nothing was left unqueued: the results file holds every request
    refusal = batch.errors[0] if batch.errors else None
    return unqueued_results(
        blobs.open_stream(source.blob_key, chunk_bytes=chunk),
        outcome=unqueued_outcome(batch) or "errored",
        refusal=refusal,
        max_line_bytes=settings.line_max_bytes,
    )


def delete_message_batch(session: Session, *, batch: Batch) -> list[str]:
    """Delete an ended batch (fetched with `lock=True`): hide it, scrub its content, mark its files deleted;
    return the object keys to remove once this commits. Its usage and cost stay in the finance reports."""
    _require_ended(batch)
    batch.deleted_at = now()
    manifest, batch.manifest_key = batch.manifest_key, None  # it names the objects going now: it goes too
    return drop_content(session, batch) + ([manifest] if manifest else [])


def _require_ended(batch: Batch) -> None:
    """Results and deletion need an ended batch (the API says so first, in Anthropic's words)."""
    if batch.status not in lifecycle.TERMINAL:
        raise NotEnded(f"Message Batch {batch.id} has not ended yet.")
