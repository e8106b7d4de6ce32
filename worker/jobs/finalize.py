"""Finalize: once every request of a batch is terminal, write output.jsonl, errors.jsonl and manifest.json.

Three short steps, so no transaction spans the upload of a result file: mark `finalizing`, stream the
files, then record them and the end state and write the small manifest naming them (storage/batches/manifests.py).
File ids and keys are derived from the batch id, so a re-run after a crash overwrites the same objects
instead of leaving a second copy.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Iterator

import orjson
from sqlalchemy.orm import Session

from storage import lifecycle
from storage.batches.batches import attach_result_file, get_batch
from storage.batches.finish_predictions import observe_finish
from storage.batches.manifests import write_manifest
from storage.db import transaction
from storage.files.blobs import BlobStore, StoredBlob
from storage.files.blobs.layout import batch_object_key
from storage.files.files import record_result_file, tenant_folder
from storage.metrics.events import observe_finalized
from storage.protocols import BatchObject, Protocol, RenderLine, protocol_of
from storage.queue.backlog import batch_done
from storage.queue.expiry import ran_past_deadline
from storage.queue.leases import has_expired_requests
from storage.queue.result_rows import iter_results
from storage.settings import get_settings

log = logging.getLogger(__name__)

CHUNK_BYTES = 1024 * 1024
_SUCCESS = (lifecycle.REQ_COMPLETED,)
_FAILURE = (lifecycle.REQ_FAILED, lifecycle.REQ_EXPIRED, lifecycle.REQ_CANCELLED)


def finalize_batch(blobs: BlobStore, *, batch_id: str) -> str | None:
    """Write the result files and manifest of a batch whose requests are all terminal; return its end status."""
    started = time.perf_counter()
    with transaction() as session:
        batch = get_batch(session, tenant_id=None, batch_id=batch_id, lock=True)
        if batch.status not in (lifecycle.IN_PROGRESS, lifecycle.CANCELLING, lifecycle.FINALIZING):
            return None
        if not batch_done(session, batch_id=batch_id):
            return None
        target = _end_state(session, status=batch.status, batch_id=batch_id)
        if target == lifecycle.COMPLETED and batch.status == lifecycle.IN_PROGRESS:
            lifecycle.transition(batch, lifecycle.FINALIZING)
        tenant_id = batch.tenant_id
        folder = tenant_folder(session, tenant_id=tenant_id)
        protocol = protocol_of(batch)
    written = {
        kind: (
            _write(blobs, batch_id=batch_id, kind=kind, folder=folder, statuses=statuses, render=render, name=name),
            purpose,
        )
        for kind, statuses, render, purpose, name in _result_files(protocol)
    }
    with transaction() as session:
        batch = get_batch(session, tenant_id=None, batch_id=batch_id, lock=True)
        if batch.status in lifecycle.TERMINAL:
            return batch.status
        for kind, (stored, purpose) in written.items():
            if stored is None:
                continue
            file_id, blob = stored
            filename = f"{batch_id}_{kind}.jsonl"
            record_result_file(
                session,
                file_id=file_id,
                tenant_id=tenant_id,
                filename=filename,
                blob_key=blob.key,
                size=blob.size,
                sha256=blob.sha256,
                expires_after_seconds=batch.output_expires_after_seconds,
                purpose=purpose,
            )
            attach_result_file(batch, kind=kind, file_id=file_id)
        lifecycle.transition(batch, target)
        manifest = write_manifest(session, blobs, batch=batch, folder=folder, settings=get_settings())
    observe_finalized(manifest, seconds=time.perf_counter() - started)
    observe_finish(batch)  # its predicted finish against this one
    log.info("batch %s finalized as %s", batch_id, target)
    return target


def _result_files(protocol: Protocol) -> list[tuple[str, tuple[str, ...], RenderLine, str, BatchObject]]:
    """(kind, the request statuses it holds, the line renderer, file purpose, object name) per result file."""
    return [
        (
            file.kind,
            (_SUCCESS if file.successes else ()) + (_FAILURE if file.failures else ()),
            protocol.render_line,
            file.purpose,
            file.name,
        )
        for file in protocol.result_files
    ]


def _end_state(session: Session, *, status: str, batch_id: str) -> str:
    if status == lifecycle.CANCELLING:
        return lifecycle.CANCELLED
    expired = has_expired_requests(session, batch_id=batch_id) or ran_past_deadline(session, batch_id=batch_id)
    return lifecycle.EXPIRED if expired and status != lifecycle.FINALIZING else lifecycle.COMPLETED


def result_file_id(batch_id: str, kind: str) -> str:
    """The stable id of a batch's output or error file."""
    return "file-" + hashlib.sha256(f"{batch_id}:{kind}".encode()).hexdigest()[:24]


def _write(
    blobs: BlobStore,
    *,
    batch_id: str,
    kind: str,
    folder: str,
    statuses: tuple[str, ...],
    render: RenderLine,
    name: BatchObject,
) -> tuple[str, StoredBlob] | None:
    file_id = result_file_id(batch_id, kind)
    key = batch_object_key(tenant=folder, batch_id=batch_id, name=name)
    with transaction() as session:
        lines = _result_lines(session, batch_id=batch_id, statuses=statuses, render=render)
        first = next(lines, None)
        if first is None:
            return None
        stored = blobs.put_stream(key, _chunks(first, lines))
    return file_id, stored


def _chunks(first: bytes, rest: Iterator[bytes]) -> Iterator[bytes]:
    buffer = bytearray(first)
    for line in rest:
        buffer += line
        if len(buffer) >= CHUNK_BYTES:
            yield bytes(buffer)
            buffer.clear()
    if buffer:
        yield bytes(buffer)


def _result_lines(session: Session, *, batch_id: str, statuses: tuple[str, ...], render: RenderLine) -> Iterator[bytes]:
    for row in iter_results(session, batch_id=batch_id, statuses=statuses):
        yield orjson.dumps(render(*row)) + b"\n"
