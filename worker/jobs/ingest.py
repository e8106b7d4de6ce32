"""Ingest: stream a batch's input file once, report every bad line, or fill the queue.

Rows are inserted in chunks inside a savepoint while checking; any bad line rolls the savepoint back,
so a rejected file leaves no queue rows and costs no compute. Once every line is valid, admission
(storage/batches/admission.py `admit`) judges the queue as it would be with the job in it and returns a
verdict: a rejection, or warnings. The batch row changes only through storage/batches/batches.py.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Iterable, Iterator
from typing import Any

from sqlalchemy.orm import Session

from storage import lifecycle
from storage.adapters.registry import adapter_bases
from storage.batches.admission import Problem, admit
from storage.batches.batches import fail_batch, get_batch, mark_ingested, record_model
from storage.batches.trials import start_trial
from storage.errors import FileNotFound
from storage.files.blobs import BlobStore
from storage.files.files import get_file
from storage.files.uploads import fill_checksum
from storage.lines.reader import LineChecker, LineError, ParsedLine, ProblemList, clip, iter_lines
from storage.metrics import events
from storage.models import Batch
from storage.protocols import protocol_of
from storage.queue.batch_rows import fail_unserved, queued_models
from storage.queue.enqueue import DuplicateCustomId, QueueWriter, new_row, set_prefix_keys
from storage.queue.prefixes import SharedPrefixes, prefix_key_of, with_adapter
from storage.settings import Settings

log = logging.getLogger(__name__)

INSERT_CHUNK = 2000
# ...or fewer rows once their lines hold this many bytes: 2,000 lines of 160 KB (an 8 GB Upload's) would otherwise
# keep 320 MB of parsed bodies in memory between writes.
INSERT_CHUNK_BYTES = 16 * 1024 * 1024


def ingest_batch(session: Session, blobs: BlobStore, settings: Settings, *, batch_id: str) -> str:
    """Validate a `validating` batch and enqueue its lines; return the batch's new status."""
    # Read once, under the row lock: a concurrent duplicate pass waits here, then sees the batch ingested.
    batch = get_batch(session, tenant_id=None, batch_id=batch_id, lock=True)
    if batch.status != lifecycle.VALIDATING:
        return batch.status  # already ingested (or cancelled): tasks are idempotent
    started = time.perf_counter()
    status = _ingest(session, blobs, settings, batch=batch)
    problems = batch.errors or []
    events.observe_ingest(
        enqueued=batch.request_total, problems=problems, status=status, seconds=time.perf_counter() - started
    )
    return status


def _ingest(session: Session, blobs: BlobStore, settings: Settings, *, batch: Batch) -> str:
    try:
        source = get_file(session, tenant_id=batch.tenant_id, file_id=batch.input_file_id)
    except FileNotFound:
        return _fail(batch, [LineError(0, "file_not_found", "The input file was deleted.")])
    errors = ProblemList()  # the first PROBLEMS_MAX bad lines and a count of the rest
    checksum = _Checksum(source.sha256)  # an Upload's file has none until its first full read: this one
    savepoint = session.begin_nested()
    # The first pass keeps no set of custom_ids (its memory would grow with the file): the queue's unique
    # index finds a repeated one. A file with any bad line is read once more with every check, so each bad
    # line (duplicates included) is reported with its number; such a file never queues anything.
    try:
        count = _stream_into_queue(
            session,
            blobs,
            settings,
            batch=batch,
            blob_key=source.blob_key,
            errors=errors,
            track_duplicates=False,
            checksum=checksum,
        )
    except DuplicateCustomId:
        errors.add(LineError(0, "duplicate_custom_id", "The file repeats a custom_id."))  # replaced below
    if errors:
        savepoint.rollback()
        checksum.record(session, file_id=source.id)
        errors = ProblemList()
        savepoint = session.begin_nested()
        count = _stream_into_queue(
            session, blobs, settings, batch=batch, blob_key=source.blob_key, errors=errors, track_duplicates=True
        )
    if not errors and count == 0:
        errors.add(LineError(0, "empty_file", "The input file has no requests."))
    one_model = protocol_of(batch).one_model  # a batch that may mix models: unserved ones end as 404s
    if not errors and one_model and batch.model not in settings.served_models():
        errors.add(LineError(1, "model_not_found", f"The model {clip(batch.model)} is not served here."))
    if errors:
        savepoint.rollback()
        return _fail(batch, errors)
    if not one_model:
        fail_unserved(session, batch_id=batch.id, served=settings.served_models())
    models = [batch.model or ""] if protocol_of(batch).one_model else queued_models(session, batch_id=batch.id)
    verdict = admit(session, settings, batch=batch, models=models)
    if verdict.rejection is not None:
        savepoint.rollback()
        return _reject(batch, verdict.rejection)
    savepoint.commit()
    checksum.record(session, file_id=source.id)
    mark_ingested(
        session, batch=batch, request_total=count, warnings=verdict.warnings, predicted_finish_at=verdict.finish_at
    )
    start_trial(session, settings, batch=batch)  # a trial's lines claimed first (storage/batches/trials.py)
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
    checksum: _Checksum | None = None,
) -> int:
    protocol = protocol_of(batch)
    checker = LineChecker(
        endpoint=batch.endpoint,
        max_requests=protocol.max_requests(settings),
        model=batch.model,
        one_model=protocol.one_model,
        track_duplicates=track_duplicates,
        default_models=settings.default_models(),
        adapters=adapter_bases(session, settings, tenant_id=batch.tenant_id),
        max_adapters=settings.batch_max_adapters,
    )
    pending: list[dict[str, Any]] = []
    pending_bytes = 0
    prefixes = SharedPrefixes()
    chunks = blobs.open_stream(blob_key, chunk_bytes=settings.stream_chunk_bytes)
    if checksum is not None:
        chunks = checksum.over(chunks)
    with QueueWriter(session) as writer:
        for number, raw in iter_lines(chunks, max_line_bytes=settings.line_max_bytes):
            outcome = checker.check(number, raw, max_line_bytes=settings.line_max_bytes)
            if isinstance(outcome, LineError):
                errors.add(outcome)
            elif isinstance(outcome, ParsedLine) and not errors:
                row = new_row(batch, outcome, line_bytes=len(raw or b""))
                key = prefix_key_of(outcome.url, outcome.body, chars=settings.prefix_chars)
                prefixes.assign(row, with_adapter(key, outcome.adapter))
                pending.append(row)
                pending_bytes += len(raw or b"")
                # Rows wait this long so most first rows of a prefix get its key.
                if len(pending) >= INSERT_CHUNK or pending_bytes >= INSERT_CHUNK_BYTES:
                    writer.write(pending)
                    pending.clear()
                    pending_bytes = 0
                    prefixes.inserted()
        if pending and not errors:
            writer.write(pending)
    if prefixes.late_keys and not errors:
        set_prefix_keys(session, batch_id=batch.id, keys=prefixes.late_keys)
    if batch.model is None:  # the first line was unreadable at create: the batch fails validation anyway
        record_model(batch, model=checker.model)
    return checker.accepted


class _Checksum:
    """The SHA-256 of an input file whose row has none (an Upload's file, storage/files/uploads.py), taken as the
    first pass streams it and recorded once that pass read it to the end: no read of its own."""

    def __init__(self, known: str) -> None:
        self.digest = None if known else hashlib.sha256()
        self.complete = False

    def over(self, chunks: Iterable[bytes]) -> Iterator[bytes]:
        if self.digest is None:
            yield from chunks
            return
        for chunk in chunks:
            self.digest.update(chunk)
            yield chunk
        self.complete = True

    def record(self, session: Session, *, file_id: str) -> None:
        if self.digest is not None and self.complete:
            fill_checksum(session, file_id=file_id, sha256=self.digest.hexdigest())
            self.digest = None


def _reject(batch: Batch, problem: Problem) -> str:
    fail_batch(batch, errors=[problem])
    log.info("batch %s refused at admission: %s", batch.id, problem["code"])
    return batch.status


def _fail(batch: Batch, errors: ProblemList | list[LineError]) -> str:
    fail_batch(batch, errors=errors.to_json() if isinstance(errors, ProblemList) else [e.to_json() for e in errors])
    total = errors.total if isinstance(errors, ProblemList) else len(errors)
    log.info("batch %s failed validation: %d bad lines", batch.id, total)
    return batch.status
