"""The retention sweep on real storage (SQLite + folder, Postgres + moto S3): bounded passes, oldest first."""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from storage.clock import now
from storage.files.blobs import BlobStore, StoredBlob, get_blob_store
from storage.files.files import create_file
from storage.files.retention import sweep_expired_files
from storage.models import File
from tests.factories import make_tenant


def files(session: Session, count: int, *, expires_at: int | None) -> list[File]:
    tenant = make_tenant(session)
    made = []
    for i in range(count):
        row = create_file(
            session, get_blob_store(), tenant_id=tenant.id, filename=f"{i}.jsonl", purpose="batch", chunks=[b"{}\n"]
        )
        row.expires_at = None if expires_at is None else expires_at - i  # later files expired earlier
        made.append(row)
    session.flush()
    return made


def test_a_backlog_of_expired_files_is_worked_off_in_bounded_passes_oldest_first(session: Session) -> None:
    expired = files(session, 30, expires_at=now() - 10)
    kept = files(session, 2, expires_at=None) + files(session, 1, expires_at=now() + 3600)
    blobs = get_blob_store()
    # the count limit is what is tested here; the time budget has its own test (a loaded machine must not cut a pass)
    assert sweep_expired_files(session, blobs, limit=12, budget_seconds=600) == 12
    oldest = {row.id for row in expired[-12:]}
    assert not any(blobs.exists(row.blob_key) for row in expired if row.id in oldest)
    assert all(blobs.exists(row.blob_key) for row in expired if row.id not in oldest)
    assert sweep_expired_files(session, blobs, limit=12, budget_seconds=600) == 12
    assert sweep_expired_files(session, blobs, limit=12, budget_seconds=600) == 6
    assert sweep_expired_files(session, blobs, limit=12, budget_seconds=600) == 0
    remaining = set(session.scalars(select(File.id)))
    assert remaining == {row.id for row in kept} and all(blobs.exists(row.blob_key) for row in kept)


class SlowDeletes:
    """The real store, with each delete taking 50 ms and one object that cannot be deleted."""

    def __init__(self, inner: BlobStore, *, broken: str) -> None:
        self.inner, self.broken, self.deletes = inner, broken, 0

    def put_stream(self, key: str, chunks: Iterable[bytes]) -> StoredBlob:
        return self.inner.put_stream(key, chunks)

    def open_stream(self, key: str, *, chunk_bytes: int = 1024 * 1024) -> Iterator[bytes]:
        return self.inner.open_stream(key, chunk_bytes=chunk_bytes)

    def presign(self, key: str, *, expires_seconds: int = 3600) -> str | None:
        return self.inner.presign(key, expires_seconds=expires_seconds)

    def exists(self, key: str) -> bool:
        return self.inner.exists(key)

    def delete(self, key: str) -> None:
        time.sleep(0.05)
        self.deletes += 1
        if key == self.broken:
            raise OSError("object storage unreachable")
        self.inner.delete(key)


def test_a_slow_or_failing_object_store_neither_stalls_a_pass_nor_loses_the_row(session: Session) -> None:
    expired = files(session, 40, expires_at=now() - 10)
    broken = expired[-1]  # the oldest: first in line
    slow = SlowDeletes(get_blob_store(), broken=broken.blob_key)
    started = time.monotonic()
    gone = sweep_expired_files(session, slow, limit=100, budget_seconds=0.3)
    assert time.monotonic() - started < 1.5 and slow.deletes < 40  # the time budget ended the pass early
    assert gone == slow.deletes - 1  # the broken object's row stays for the next pass
    assert session.get(File, broken.id) is not None
    left = session.scalar(select(func.count()).select_from(File))
    assert left == 40 - gone
