"""Many clients at once on either backend: every upload and batch creation succeeds (issue 14, item 9).

A bounded version of `bench/load.py` (which runs 100 clients x 3 rounds against `backfill serve`).
"""

from __future__ import annotations

import pytest

from bench.load import drive
from tests.conftest import Backend, LiveServer, make_key
from tests.integration.api.conftest import FAKE_MODELS

pytestmark = pytest.mark.backfill_env({"BACKFILL_MODELS": FAKE_MODELS})
CLIENTS = 60  # more than the 40 request threads, so requests queue for threads while others hold the database
# Spread over tenants so that each stays within its share of the threads (an eighth: 5; api/fair_share.py), the
# probe included: all 60 reach the threads at once. One tenant's 60 clients would queue for its share.
TENANTS = 15


def stored_objects() -> set[str]:
    from storage.files.blobs import get_blob_store

    store = get_blob_store()
    if hasattr(store, "client"):
        return {item["Key"] for item in store.client.list_objects_v2(Bucket=store.bucket).get("Contents", [])}
    return {str(path.relative_to(store.root)) for path in store.root.rglob("*") if path.is_file()}


def test_sixty_clients_uploading_and_creating_batches_at_once_all_succeed(api: LiveServer, backend: Backend) -> None:
    from storage.db import transaction
    from storage.models import File

    keys = [make_key(f"acme-{i}") for i in range(TENANTS)]
    before = stored_objects()  # the test bucket outlives each test's tables
    result = drive(api.base_url, lambda index: keys[index % TENANTS], clients=CLIENTS, lines=5)
    summary = result.summary()
    assert summary["errors"] == 0, summary
    assert summary["batches_created"] == CLIENTS
    assert summary["health_p99_ms"] is None or summary["health_p99_ms"] < 10_000, summary
    with transaction() as session:
        keys = {row.blob_key for row in session.query(File)}
    # No orphan upload: every input object written now has its row. (Result objects and manifests belong to
    # batches finalizing meanwhile; the chaos suite's history checker covers those once work has settled.)
    uploads = {name for name in stored_objects() - before if "/files/" in f"/{name}"}
    assert uploads and uploads <= keys
