"""Where batch manifests name a file, so a file's deletion can leave them true (storage/batches/manifests.py).

A manifest is written by finalize (above files/ in storage's layers); deleting a file only has to find the
manifests that name it and null their pointers, which needs the batch rows' columns and the object store,
not the code that writes manifests.
"""

from __future__ import annotations

import logging

import orjson
from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from storage.files.blobs import BlobStore
from storage.models import Batch

log = logging.getLogger(__name__)

# The sections of a manifest that name a file (its key, size and SHA-256).
MANIFEST_SECTIONS = ("input_file", "output", "errors")


def forget_file(session: Session, blobs: BlobStore, *, file_id: str) -> None:
    """A file is being deleted: wherever an ended batch's manifest names it, its key, size and SHA-256 become
    null (the rest of the manifest stays as finalize wrote it), so no manifest points at a missing object."""
    named = or_(Batch.input_file_id == file_id, Batch.output_file_id == file_id, Batch.error_file_id == file_id)
    for key in session.scalars(select(Batch.manifest_key).where(named, Batch.manifest_key.is_not(None))):
        assert key is not None
        try:
            manifest = orjson.loads(b"".join(blobs.open_stream(key)))
        except Exception:  # a manifest already gone or unreadable must not stop the file's deletion
            log.warning("manifest %s could not be read to forget file %s", key, file_id, exc_info=True)
            continue
        for section in MANIFEST_SECTIONS:
            entry = manifest.get(section)
            if isinstance(entry, dict) and entry.get("file_id") == file_id:
                entry.update(key=None, bytes=None, sha256=None)
        blobs.put_stream(key, [orjson.dumps(manifest, option=orjson.OPT_INDENT_2) + b"\n"])
