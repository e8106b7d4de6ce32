"""Objects as files under one folder: the embedded default."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable, Iterator
from pathlib import Path

from storage.files.blobs import StoredBlob


class LocalBlobStore:
    """Writes go to a temporary file and are renamed into place, so readers never see half a file."""

    def __init__(self, root: Path) -> None:
        self.root = root.resolve()
        self.root.mkdir(parents=True, exist_ok=True)

    def _path(self, key: str) -> Path:
        path = (self.root / key).resolve()
        if self.root not in path.parents:
            raise ValueError(f"object key escapes the store: {key!r}")
        return path

    def put_stream(self, key: str, chunks: Iterable[bytes]) -> StoredBlob:
        """Write chunks to `key`, hashing as they pass."""
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".partial")
        digest = hashlib.sha256()
        size = 0
        try:
            with open(tmp, "wb") as handle:
                for chunk in chunks:
                    digest.update(chunk)
                    size += len(chunk)
                    handle.write(chunk)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        return StoredBlob(key=key, size=size, sha256=digest.hexdigest())

    def open_stream(self, key: str, *, chunk_bytes: int = 1024 * 1024) -> Iterator[bytes]:
        """Yield the object in chunks of at most `chunk_bytes`."""
        with open(self._path(key), "rb") as handle:
            while chunk := handle.read(chunk_bytes):
                yield chunk

    def presign(self, key: str, *, expires_seconds: int = 3600) -> str | None:
        """Local objects have no URL of their own; download them through the API."""
        return None

    def delete(self, key: str) -> None:
        """Remove the object if it exists."""
        self._path(key).unlink(missing_ok=True)

    def exists(self, key: str) -> bool:
        """True if the object is stored."""
        return self._path(key).is_file()
