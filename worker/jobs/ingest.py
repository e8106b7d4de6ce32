"""Ingest: stream a batch's input file once, report every bad line, or fill the queue.

Rows are inserted in chunks inside a savepoint while checking; any bad line rolls the savepoint back,
so a rejected file leaves no queue rows and costs no compute. Once every line is valid, admission runs
on the queue as it would be with the job in it: the tenant's enqueued-token quota for the model
(`token_limit_exceeded`), then whether the job and those already accepted can finish inside their windows
at the measured throughput (`admission_policy`: a `deadline_at_risk` warning, or `deadline_infeasible`).
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Any

from sqlalchemy.orm import Session

from storage.batches import lifecycle
from storage.batches.batches import get_batch
from storage.errors import FileNotFound
from storage.files.blobs import BlobStore
from storage.files.files import get_file
from storage.lines.reader import LineChecker, LineError, ParsedLine, ProblemList, clip, iter_lines
from storage.models import Batch
from storage.planning.admission import Admission, admission_check
from storage.protocols import protocol_of
from storage.queue.backlog import open_jobs
from storage.queue.batch_rows import fail_unserved, queued_models
from storage.queue.enqueue import DuplicateCustomId, QueueWriter, new_row, set_prefix_keys
from storage.queue.prefixes import SharedPrefixes, prefix_key_of
from storage.settings import Settings
from storage.tenants import tenant_name
from worker.feed.probe import observed_ingest

log = logging.getLogger(__name__)

INSERT_CHUNK = 2000
Problem = dict[str, Any]  # a batch-level entry of `errors.data` / `warnings.data`


@observed_ingest
def ingest_batch(session: Session, blobs: BlobStore, settings: Settings, *, batch_id: str) -> str:
    """Validate a `validating` batch and enqueue its lines; return the batch's new status."""
    batch = get_batch(session, tenant_id=None, batch_id=batch_id, lock=True)
    if batch.status != lifecycle.VALIDATING:
        return batch.status  # already ingested (or cancelled): tasks are idempotent
    try:
        source = get_file(session, tenant_id=batch.tenant_id, file_id=batch.input_file_id)
    except FileNotFound:
        return _fail(batch, [LineError(0, "file_not_found", "The input file was deleted.")])
    errors = ProblemList()  # the first PROBLEMS_MAX bad lines and a count of the rest
    savepoint = session.begin_nested()
    # The first pass keeps no set of custom_ids (its memory would grow with the file): the queue's unique
    # index finds a repeated one. A file with any bad line is read once more with every check, so each bad
    # line (duplicates included) is reported with its number; such a file never queues anything.
    try:
        count = _stream_into_queue(
            session, blobs, settings, batch=batch, blob_key=source.blob_key, errors=errors, track_duplicates=False
        )
    except DuplicateCustomId:
        errors.add(LineError(0, "duplicate_custom_id", "The file repeats a custom_id."))  # replaced below
    if errors:
        savepoint.rollback()
        errors = ProblemList()
        savepoint = session.begin_nested()
        count = _stream_into_queue(
            session, blobs, settings, batch=batch, blob_key=source.blob_key, errors=errors, track_duplicates=True
        )
    if not errors and count == 0:
        errors.add(LineError(0, "empty_file", "The input file has no requests."))
    one_model = protocol_of(batch).one_model  # an Anthropic batch may mix models; unserved ones end as 404s
    if not errors and one_model and batch.model not in settings.served_models():
        errors.add(LineError(1, "model_not_found", f"The model {clip(batch.model)} is not served here."))
    if errors:
        savepoint.rollback()
        return _fail(batch, errors)
    if not one_model:
        fail_unserved(session, batch_id=batch.id, served=settings.served_models())
    rejection, warnings = _admit(session, settings, batch=batch)
    if rejection is not None:
        savepoint.rollback()
        return _reject(batch, rejection)
    savepoint.commit()
    batch.warnings = warnings or None
    batch.request_total = count
    lifecycle.transition(batch, lifecycle.IN_PROGRESS)
    session.flush()
    log.info("batch %s ingested: %d requests", batch.id, count)
    return batch.status


def _stream_into_queue(
    session: Session,
    blobs: BlobStore,
    settings: Settings,
    *,
    batch: Batch,
    blob_key: str,
    errors: ProblemList,
    track_duplicates: bool,
) -> int:
    protocol = protocol_of(batch)
    checker = LineChecker(
        endpoint=batch.endpoint,
        max_requests=protocol.max_requests(settings),
        model=batch.model,
        one_model=protocol.one_model,
        track_duplicates=track_duplicates,
    )
    pending: list[dict[str, Any]] = []
    prefixes = SharedPrefixes()
    chunks = blobs.open_stream(blob_key, chunk_bytes=settings.stream_chunk_bytes)
    with QueueWriter(session) as writer:
        for number, raw in iter_lines(chunks, max_line_bytes=settings.line_max_bytes):
            outcome = checker.check(number, raw, max_line_bytes=settings.line_max_bytes)
            if isinstance(outcome, LineError):
                errors.add(outcome)
            elif isinstance(outcome, ParsedLine) and not errors:
                row = new_row(batch, outcome, line_bytes=len(raw or b""))
                prefixes.assign(row, prefix_key_of(outcome.url, outcome.body, chars=settings.prefix_chars))
                pending.append(row)
                if len(pending) >= INSERT_CHUNK:  # rows wait this long so most first rows of a prefix get its key
                    writer.write(pending)
                    pending.clear()
                    prefixes.inserted()
        if pending and not errors:
            writer.write(pending)
    if prefixes.late_keys and not errors:
        set_prefix_keys(session, batch_id=batch.id, keys=prefixes.late_keys)
    if batch.model is None:  # the first line was unreadable at create: the batch fails validation anyway
        batch.model = checker.model
    return checker.accepted


def _admit(session: Session, settings: Settings, *, batch: Batch) -> tuple[Problem | None, list[Problem]]:
    """(a rejection, warnings) for a job whose rows are queued but not yet committed, model by model."""
    warnings: list[Problem] = []
    models = [batch.model or ""] if protocol_of(batch).one_model else queued_models(session, batch_id=batch.id)
    for model in models:
        rejection, more = _admit_model(session, settings, batch=batch, model=model)
        if rejection is not None:
            return rejection, []
        warnings += more
    return None, warnings


def _admit_model(
    session: Session, settings: Settings, *, batch: Batch, model: str
) -> tuple[Problem | None, list[Problem]]:
    limit = _token_limit(session, settings, tenant_id=batch.tenant_id)
    if limit is None and settings.admission_policy == "off":
        return None, []
    jobs = open_jobs(session, model=model)
    if limit is not None:
        mine = [job for job in jobs if job.tenant_id == batch.tenant_id]
        enqueued = sum(job.shape.input_tokens for job in mine)
        if enqueued > limit:
            added = sum(job.shape.input_tokens for job in mine if job.batch_id == batch.id)
            quota = _quota_problem(session, batch, model=model, limit=limit, enqueued=enqueued - added, added=added)
            return quota, []
    if settings.admission_policy == "off":
        return None, []
    check = admission_check(session, batch_id=batch.id, model=model, settings=settings, jobs=jobs)
    if check.fits:
        return None, []
    measured = check.throughput.source == "measured"
    if settings.admission_policy == "reject" and measured:
        return _problem("deadline_infeasible", _deadline_message(check, rejected=True)), []
    return None, [_problem("deadline_at_risk", _deadline_message(check, rejected=False))]


def _problem(code: str, message: str) -> Problem:
    """A batch-level entry in OpenAI's `errors.data` shape (no line: it concerns the whole job)."""
    return {"code": code, "message": message, "param": None, "line": None}


def _token_limit(session: Session, settings: Settings, *, tenant_id: str) -> int | None:
    """The tenant's enqueued-token limit per model: its override (by id or name), else the default."""
    overrides = settings.enqueued_token_limits
    if tenant_id in overrides:
        return overrides[tenant_id]
    name = tenant_name(session, tenant_id=tenant_id) if overrides else None
    if name is not None and name in overrides:
        return overrides[name]
    return settings.enqueued_token_limit


def _quota_problem(session: Session, batch: Batch, *, model: str, limit: int, enqueued: int, added: int) -> Problem:
    name = tenant_name(session, tenant_id=batch.tenant_id) or batch.tenant_id
    message = (
        f"Enqueued token limit reached for {model} in organization {name}. Limit: {limit:,} enqueued "
        f"tokens; {enqueued:,} are already enqueued and this batch adds about {added:,}. Please try again "
        "once some in_progress batches have been completed, or submit a smaller batch."
    )
    return _problem("token_limit_exceeded", message)


def _deadline_message(check: Admission, *, rejected: bool) -> str:
    rate = check.throughput
    speed = f"{rate.work_per_second:,.0f} tokens/s"
    basis = f"the measured {speed}" if rate.source == "measured" else f"an assumed {speed} (not measured yet)"
    parts = []
    if check.finish_at > check.deadline_at:
        parts.append(
            f"this batch is estimated to finish at {_utc(check.finish_at)}, after its completion window "
            f"closes at {_utc(check.deadline_at)}"
        )
    if check.newly_late:
        parts.append(f"it would push {len(check.newly_late)} accepted batches past their deadlines")
    outcome = "The batch was not enqueued." if rejected else "The batch was accepted anyway; it may expire unfinished."
    return f"At {basis} behind the current backlog, {' and '.join(parts)}. {outcome}"


def _utc(at: float) -> str:
    return datetime.fromtimestamp(at, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _reject(batch: Batch, problem: Problem) -> str:
    batch.errors = [problem]
    lifecycle.transition(batch, lifecycle.FAILED)
    log.info("batch %s refused at admission: %s", batch.id, problem["code"])
    return batch.status


def _fail(batch: Batch, errors: ProblemList | list[LineError]) -> str:
    batch.errors = errors.to_json() if isinstance(errors, ProblemList) else [error.to_json() for error in errors]
    lifecycle.transition(batch, lifecycle.FAILED)
    total = errors.total if isinstance(errors, ProblemList) else len(errors)
    log.info("batch %s failed validation: %d bad lines", batch.id, total)
    return batch.status
