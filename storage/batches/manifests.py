"""A batch's manifest.json: what the batch left in object storage, for people who read the bucket.

Written by finalize in the transaction that ends the batch, next to output.jsonl and errors.jsonl (the
layout is storage/files/blobs/layout.py). It names every object of the batch with its key, size and SHA-256, so
someone with read access to the bucket alone can find, check and price a batch's results. If that
transaction rolls back after the object was written, the batch stays open, finalize runs again and
overwrites the same key: a manifest never points at objects that are not there.
"""

from __future__ import annotations

from typing import Any

import orjson
from sqlalchemy.orm import Session

from storage.batches.batches import get_batch
from storage.clock import now
from storage.errors import ManifestNotFound
from storage.files.blobs import BlobStore
from storage.files.blobs.layout import batch_object_key
from storage.finance.job_cost import batch_cost_json
from storage.models import Batch, File
from storage.protocols import protocol_of
from storage.settings import Settings

MANIFEST_VERSION = 1
_STAMPS = (
    "created_at",
    "in_progress_at",
    "finalizing_at",
    "completed_at",
    "failed_at",
    "expired_at",
    "cancelling_at",
    "cancelled_at",
    "expires_at",
)


def _object(row: File | None, *, lines: int) -> dict[str, Any] | None:
    if row is None:
        return None
    return {"file_id": row.id, "key": row.blob_key, "bytes": row.bytes, "sha256": row.sha256 or None, "lines": lines}


def _input(session: Session, batch: Batch) -> dict[str, Any]:
    row = session.get(File, batch.input_file_id)
    if row is None or row.deleted_at is not None:  # deleted since: its object is gone too
        return {"file_id": batch.input_file_id, "key": None, "bytes": None, "sha256": None}
    return {"file_id": row.id, "key": row.blob_key, "bytes": row.bytes, "sha256": row.sha256 or None}


def build_manifest(session: Session, *, batch: Batch, folder: str, settings: Settings) -> dict[str, Any]:
    """The manifest of a batch whose result files are recorded (`output_file_id`, `error_file_id`)."""
    output = session.get(File, batch.output_file_id) if batch.output_file_id else None
    errors = session.get(File, batch.error_file_id) if batch.error_file_id else None
    # Every request is one line of exactly one file: the completed ones in output, the rest in errors, unless the
    # protocol keeps one results file with every request.
    ended = batch.request_completed + batch.request_failed
    output_lines = ended if protocol_of(batch).keeps_every_request_in_one_file() else batch.request_completed
    return {
        "object": "batch.manifest",
        "version": MANIFEST_VERSION,
        "batch_id": batch.id,
        "protocol": batch.protocol,
        "endpoint": batch.endpoint,
        "model": batch.model,
        "tenant": folder,
        "status": batch.status,
        "completion_window": batch.completion_window,
        "metadata": batch.metadata_,
        "request_counts": {
            "total": batch.request_total,
            "completed": batch.request_completed,
            "failed": batch.request_failed,
        },
        "input_file": _input(session, batch),
        "output": _object(output, lines=output_lines),
        "errors": _object(errors, lines=batch.request_failed),
        "cost": batch_cost_json(session, batch, settings),
        "currency": "usd",
        **{stamp: getattr(batch, stamp) for stamp in _STAMPS},
        "written_at": now(),
    }


def write_manifest(
    session: Session, blobs: BlobStore, *, batch: Batch, folder: str, settings: Settings
) -> dict[str, Any]:
    """Write the batch's manifest.json, remember its key on the batch, and return the manifest."""
    manifest = build_manifest(session, batch=batch, folder=folder, settings=settings)
    key = batch_object_key(tenant=folder, batch_id=batch.id, name="manifest.json")
    blobs.put_stream(key, [orjson.dumps(manifest, option=orjson.OPT_INDENT_2) + b"\n"])
    batch.manifest_key = key
    session.flush()
    return manifest


def manifest_key(session: Session, *, tenant_id: str, batch_id: str) -> str:
    """The key of the tenant's batch manifest, or ManifestNotFound (not ended yet, or ended before manifests)."""
    batch = get_batch(session, tenant_id=tenant_id, batch_id=batch_id)
    if batch.manifest_key is None:
        raise ManifestNotFound(
            f"Batch '{batch_id}' has no manifest: it is written when the batch completes, expires or is cancelled "
            f"(status now '{batch.status}').",
            param="batch_id",
        )
    return batch.manifest_key
