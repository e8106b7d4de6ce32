"""Objects as files under one folder: the embedded default.

A multipart object (the Uploads API) is a folder at its key while its parts arrive: `part-00001`, `part-00002`,
... (its number: the order parts arrived), each written to `.partial` and renamed into place. Completing it writes
`manifest.json` there, the listed part names in the asked order: from then on the folder IS the object (read
through the manifest; nothing is copied or concatenated), and parts it does not list are removed.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

import orjson

from storage.files.blobs.store import PartsGone, PartSizeMismatch, StoredBlob, StoredPart

MANIFEST = "manifest.json"


def _part_name(number: int) -> str:
    return f"part-{number:05d}"


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
        """Yield the object in chunks of at most `chunk_bytes` (a multipart object: its parts, in listed order)."""
        path = self._path(key)
        files = [path / name for name in self._manifest(path)] if path.is_dir() else [path]
        for file in files:
            with open(file, "rb") as handle:
                while chunk := handle.read(chunk_bytes):
                    yield chunk

    def _manifest(self, folder: Path) -> list[str]:
        try:
            names: list[str] = orjson.loads((folder / MANIFEST).read_bytes())["parts"]
        except FileNotFoundError:  # parts still arriving: not an object yet
            raise FileNotFoundError(f"no object at {folder.relative_to(self.root)}") from None
        return names

    def presign(self, key: str, *, expires_seconds: int = 3600) -> str | None:
        """Local objects have no URL of their own; download them through the API."""
        return None

    def delete(self, key: str) -> None:
        """Remove the object if it exists (a multipart object: its folder, parts and all)."""
        path = self._path(key)
        if path.is_dir():
            self.abort_parts(key, "")
        else:
            path.unlink(missing_ok=True)

    def exists(self, key: str) -> bool:
        """True if the object is stored."""
        path = self._path(key)
        return path.is_file() or (path / MANIFEST).is_file()

    def start_parts(self, key: str) -> str:
        """Open a multipart object at `key`: its folder (the local store has no upload id: "")."""
        self._path(key).mkdir(parents=True, exist_ok=True)
        return ""

    def put_part(
        self, key: str, upload_id: str, number: int, chunks: Iterable[bytes], *, size: int | None
    ) -> StoredPart:
        """Write part `number` as it streams in; PartsGone once the object was completed or aborted.

        The folder is never re-created here, so a part racing an abort cannot leave one behind; a part renamed into
        place just after a completion removes itself (the manifest is written before unlisted parts are swept).
        """
        folder = self._path(key)
        target = folder / _part_name(number)
        tmp = target.with_name(target.name + ".partial")
        written = 0
        try:
            with open(tmp, "wb") as handle:
                for chunk in chunks:
                    written += len(chunk)
                    if size is not None and written > size:
                        raise PartSizeMismatch(f"part {number} ran past its {size} bytes")
                    handle.write(chunk)
                if size is not None and written != size:
                    raise PartSizeMismatch(f"part {number} ended at {written} of its {size} bytes")
                handle.flush()
                os.fsync(handle.fileno())  # the client is told the part is stored
            os.replace(tmp, target)
        except FileNotFoundError:
            tmp.unlink(missing_ok=True)
            raise PartsGone(key) from None
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        if (folder / MANIFEST).exists():
            target.unlink(missing_ok=True)
            raise PartsGone(key)
        return StoredPart(number=number, size=written, etag="")

    def finish_parts(self, key: str, upload_id: str, parts: Sequence[StoredPart]) -> None:
        """Make the listed parts the object, in the listed order: the manifest names them; nothing is copied."""
        folder = self._path(key)
        if not folder.is_dir() or (folder / MANIFEST).exists():
            raise PartsGone(key)
        names = [_part_name(part.number) for part in parts]
        if not all((folder / name).is_file() for name in names):
            raise PartsGone(key)
        tmp = folder / (MANIFEST + ".partial")
        with open(tmp, "wb") as handle:
            handle.write(orjson.dumps({"parts": names, "bytes": sum(part.size for part in parts)}))
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, folder / MANIFEST)
        keep = {*names, MANIFEST}
        for path in folder.iterdir():
            if path.name not in keep:
                path.unlink(missing_ok=True)

    def abort_parts(self, key: str, upload_id: str) -> None:
        """Remove the folder and every part in it (idempotent); OSError if a part arriving meanwhile kept it."""
        shutil.rmtree(self._path(key), ignore_errors=True)
        if self._path(key).exists():
            shutil.rmtree(self._path(key))  # a second pass (a part landed during the first); raises if it fails
