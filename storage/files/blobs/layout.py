"""The object layout: the one rule that names every key Backfill writes (docs/operations.md).

```
{prefix}/{tenant}/files/{file_id}.jsonl                 an uploaded input file
{prefix}/{tenant}/batches/{batch_id}/output.jsonl       a batch's output file
{prefix}/{tenant}/batches/{batch_id}/errors.jsonl       its error file
{prefix}/{tenant}/batches/{batch_id}/manifest.json      what the batch left behind (storage/batches/manifests.py)
```

A file sent through the Uploads API has the same key (on the local store a folder of its parts and a
manifest: storage/files/blobs/local.py).

`{prefix}` is BACKFILL_OBJECT_PREFIX (empty: keys start with the tenant). `{tenant}` is the tenant's name
when it is a plain path segment (letters, digits, `.`, `_`, `-`, at most 64 characters, not shaped like a
tenant id), else the tenant id: people reading the bucket see `acme/…`, and no name can escape its folder
or land in another tenant's. Rows keep their own key (`files.blob_key`, `batches.manifest_key`), so
objects written under an older rule stay readable when the rule or the prefix changes.
"""

from __future__ import annotations

import re

from storage.protocols import BatchObject
from storage.settings import get_settings

_PLAIN_SEGMENT = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")  # fullmatch: `$` would pass a trailing newline
_TENANT_ID = re.compile(r"^tenant_")


def tenant_segment(*, tenant_id: str, tenant_name: str | None) -> str:
    """The tenant's folder: its name when that is a plain, unambiguous path segment, else its id."""
    if tenant_name and _PLAIN_SEGMENT.fullmatch(tenant_name) and not _TENANT_ID.match(tenant_name):
        return tenant_name
    return tenant_id


def _join(*parts: str) -> str:
    prefix = get_settings().object_prefix
    return "/".join((prefix, *parts)) if prefix else "/".join(parts)


def input_file_key(*, tenant: str, file_id: str) -> str:
    """Where an uploaded input file lives."""
    return _join(tenant, "files", f"{file_id}.jsonl")


def batch_object_key(*, tenant: str, batch_id: str, name: BatchObject) -> str:
    """Where one of a batch's result objects lives: output, errors or the manifest."""
    return _join(tenant, "batches", batch_id, name)


_CONTENT_TYPES = {".jsonl": "application/jsonl", ".json": "application/json"}


def content_type(key: str) -> str:
    """The media type an object is stored with, from its key's suffix (every key above has one)."""
    suffix = key[key.rfind(".") :] if "." in key.rsplit("/", 1)[-1] else ""
    return _CONTENT_TYPES.get(suffix, "application/octet-stream")


def batches_prefix(*, tenant: str) -> str:
    """The folder holding every batch of a tenant (for listing)."""
    return _join(tenant, "batches") + "/"
