"""A streaming multipart/form-data reader for uploads: one pass over the body as it arrives, no spool file.

Starlette's form parser writes every file part to a temporary file before the route runs, so an upload was
read twice (network to disk, disk to object storage) one after the other. This reader is pulled by the
route: the small fields are kept, and the one file part's bytes are handed on chunk by chunk while the
client is still sending, so checking, hashing and the object store's parts overlap the transfer. Memory is
a few body chunks plus the fields it keeps (each at most FIELD_MAX_BYTES). Its limits and messages are
Starlette's (1000 fields, 1 MiB a field, "Invalid multipart data."), so hostile bodies get the same 400s.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator

from python_multipart.exceptions import FormParserError
from python_multipart.multipart import MultipartParser, parse_options_header

from storage.errors import InvalidRequest

FIELD_MAX_BYTES = 1024 * 1024  # a kept field's value (Starlette's max_part_size)
FIELDS_MAX = 1000  # non-file parts (Starlette's max_fields)


class MultipartError(InvalidRequest):
    """The body is not a multipart form this reader can read (Starlette's own 400s, same words)."""

    code = "invalid_request"


def missing(param: str) -> InvalidRequest:
    """The 400 a required form field gets when it is absent (FastAPI's words for a missing form field)."""
    return InvalidRequest(f"Invalid value for '{param}': Field required.", param=param, code="invalid_request")


class FormStream:
    """Reads `body` (the request's chunks) as multipart/form-data with one file part named `file_field`.

    `read_to_file()` reads the fields that come before the file; `file_chunks()` then yields the file's bytes
    as they arrive and, once the file part ends, reads the rest of the body (fields sent after the file).
    Only the fields named in `keep` are kept; others are read past (counted, never stored).
    """

    def __init__(self, content_type: str, body: Iterator[bytes], *, file_field: str, keep: tuple[str, ...]) -> None:
        self.fields: dict[str, str] = {}
        self.filename: str | None = None  # set when the file part begins ("" if it names none)
        self._body = body
        self._file_field = file_field
        self._keep = keep
        self._pending: deque[bytes] = deque()  # file bytes parsed but not yet handed on
        self._file_ended = False
        self._ended = False  # the closing boundary was read
        self._exhausted = False  # the body has no more chunks
        self._count = 0
        self._fed = 0  # body bytes fed to the parser before the current chunk
        self._chunk = b""  # the chunk being parsed
        self._file_offset: int | None = None  # where the file part's bytes begin in the body
        self._closing = b""  # the body's closing delimiter
        self._part: str | None = None  # the current part: the file, a kept field's name, or None (skipped)
        self._value = bytearray()
        self._header_name = bytearray()
        self._header_value = bytearray()
        self._disposition = b""
        kind, options = parse_options_header(content_type)
        self._parser: MultipartParser | None = None
        if kind != b"multipart/form-data":
            self._exhausted = True  # no form at all: the file is missing, as FastAPI reports it
            return
        if b"boundary" not in options:
            raise MultipartError("Missing boundary in multipart.")
        self._closing = b"\r\n--" + options[b"boundary"] + b"--\r\n"
        try:
            self._parser = MultipartParser(
                options[b"boundary"],
                {
                    "on_part_begin": self._on_part_begin,
                    "on_part_data": self._on_part_data,
                    "on_part_end": self._on_part_end,
                    "on_header_field": lambda data, start, end: self._header_name.extend(data[start:end]),
                    "on_header_value": lambda data, start, end: self._header_value.extend(data[start:end]),
                    "on_header_end": self._on_header_end,
                    "on_headers_finished": self._on_headers_finished,
                    "on_end": self._on_end,
                },
            )
        except FormParserError:
            raise MultipartError("Invalid multipart data.") from None

    def read_to_file(self) -> bool:
        """Read the body up to the file part's first bytes, or to its end; True if a file part began."""
        while self.filename is None and self._feed():
            pass
        return self.filename is not None

    def file_size(self, content_length: int | None) -> int | None:
        """The file part's exact size, from the body's declared length, when the file is the form's last part and
        the body ends with the closing delimiter (as the SDKs, curl and every HTTP library send a form), else
        None (no length declared). Known once `read_to_file()` has reached the file's bytes; an object store that
        needs a part's length up front streams on it, and the reader it streams from checks it to the byte."""
        while self._file_offset is None and not self._file_ended and self._feed():
            pass  # the file's first bytes were not parsed yet (they are kept for `file_chunks`)
        if content_length is None or self._file_offset is None:
            return None
        return max(0, content_length - self._file_offset - len(self._closing))

    def file_chunks(self) -> Iterator[bytes]:
        """The file part's bytes as they arrive, then the rest of the body is read (and checked) before the end."""
        while True:
            while self._pending:
                yield self._pending.popleft()
            if self._file_ended:
                break
            if not self._feed():
                raise MultipartError("The upload ended inside its file part.", param=self._file_field)
        while self._feed():
            pass
        if not self._ended:
            raise MultipartError("Invalid multipart data.")

    def _feed(self) -> bool:
        """Parse the next chunk of the body; False once the body is over."""
        if self._exhausted or self._parser is None:
            return False
        chunk = next(self._body, None)
        if chunk is None:
            self._exhausted = True
            return False
        self._chunk = chunk
        try:
            self._parser.write(chunk)
        except FormParserError:
            raise MultipartError("Invalid multipart data.") from None
        self._fed += len(chunk)
        return True

    def _on_part_begin(self) -> None:
        self._disposition = b""
        self._value.clear()

    def _on_header_end(self) -> None:
        if bytes(self._header_name).lower() == b"content-disposition":
            self._disposition = bytes(self._header_value)
        self._header_name.clear()
        self._header_value.clear()

    def _on_headers_finished(self) -> None:
        _, options = parse_options_header(self._disposition)
        if b"name" not in options:
            raise MultipartError('The Content-Disposition header field "name" must be provided.')
        name = _decode(options[b"name"])
        if name == self._file_field:
            if self.filename is not None:
                raise MultipartError(
                    f"Send one '{name}' part per upload: this body has more than one.", param=self._file_field
                )
            self.filename = _decode(options.get(b"filename", b""))
            self._part = name
            return
        self._count += 1
        if self._count > FIELDS_MAX:
            raise MultipartError(f"Too many fields. Maximum number of fields is {FIELDS_MAX}.")
        self._part = name if name in self._keep else None

    def _on_part_data(self, data: bytes, start: int, end: int) -> None:
        if self._part is None:
            return
        if self._part == self._file_field:
            if self._file_offset is None:  # the first bytes: in this chunk, or held back from the previous one
                self._file_offset = self._fed + start if data is self._chunk else self._fed - (end - start)
            self._pending.append(data[start:end])
            return
        if len(self._value) + end - start > FIELD_MAX_BYTES:
            raise MultipartError(f"Part exceeded maximum size of {FIELD_MAX_BYTES // 1024}KB.")
        self._value.extend(data[start:end])

    def _on_part_end(self) -> None:
        if self._part == self._file_field:
            self._file_ended = True
        elif self._part is not None:
            self.fields[self._part] = _decode(bytes(self._value))
        self._part = None

    def _on_end(self) -> None:
        self._ended = True


def _decode(raw: bytes) -> str:
    """A field or filename as UTF-8, else Latin-1 (as Starlette decodes them)."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return raw.decode("latin-1")
