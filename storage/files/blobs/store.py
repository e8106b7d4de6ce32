"""The BlobStore protocol and what its stores hand back (S3 and the local folder implement it)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class StoredBlob:
    """What a finished upload left behind: its size and SHA-256."""

    key: str
    size: int
    sha256: str


@dataclass(frozen=True)
class StoredPart:
    """One part of a multipart object as the store holds it: its number (1..10,000), size and ETag."""

    number: int
    size: int
    etag: str


class PartsGone(Exception):
    """The store no longer holds the multipart upload: it was completed or aborted (a cancel, an expiry)."""


class PartSizeMismatch(ValueError):
    """A part's bytes ended before, or ran past, the size announced for it (nothing of it is stored)."""


class PartsOutOfOrder(Exception):
    """The store assembles parts in the order of their numbers, and the order asked for is another."""


class BlobStore(Protocol):
    """Stream objects in and out in bounded chunks; never hold a whole object in memory.

    Multipart objects (the Uploads API) are written part by part: `start_parts` opens one at its final key,
    `put_part` stores each part as it streams in, `finish_parts` makes the listed parts the object without
    copying them, and `abort_parts` removes every part (idempotent).
    """

    def put_stream(self, key: str, chunks: Iterable[bytes]) -> StoredBlob: ...

    def open_stream(self, key: str, *, chunk_bytes: int = 1024 * 1024) -> Iterator[bytes]: ...

    def presign(self, key: str, *, expires_seconds: int = 3600) -> str | None: ...

    def delete(self, key: str) -> None: ...

    def exists(self, key: str) -> bool: ...

    def start_parts(self, key: str) -> str: ...

    def put_part(
        self, key: str, upload_id: str, number: int, chunks: Iterable[bytes], *, size: int | None
    ) -> StoredPart: ...

    def finish_parts(self, key: str, upload_id: str, parts: Sequence[StoredPart]) -> None: ...

    def abort_parts(self, key: str, upload_id: str) -> None: ...
