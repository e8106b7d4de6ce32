"""The streaming multipart reader: fields and one file part from a body fed in arbitrary chunks, in one pass."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from api.multipart import FIELD_MAX_BYTES, FIELDS_MAX, FormStream, MultipartError

CTYPE = "multipart/form-data; boundary=xyz"
KEEP = ("purpose", "expires_after[seconds]")


def field(name: str, value: bytes) -> bytes:
    return f'--xyz\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n'.encode() + value + b"\r\n"


def file_part(data: bytes, filename: str = "jobs.jsonl", name: str = "file") -> bytes:
    head = f'--xyz\r\nContent-Disposition: form-data; name="{name}"; filename="{filename}"\r\n'
    return (head + "Content-Type: application/octet-stream\r\n\r\n").encode() + data + b"\r\n"


END = b"--xyz--\r\n"


def pieces(body: bytes, size: int) -> Iterator[bytes]:
    for start in range(0, len(body), size):
        yield body[start : start + size]


def read(body: bytes, size: int = 7) -> tuple[FormStream, bytes]:
    form = FormStream(CTYPE, pieces(body, size), file_field="file", keep=KEEP)
    assert form.read_to_file()
    return form, b"".join(form.file_chunks())


# Bytes that look like a boundary but are not one, a CRLF at the end, and binary: all belong to the file.
DATA = b'{"a": 1}\r\n--xy\r\n--xyzz is not the end\r\n' + bytes(range(256)) * 50 + b"\r\n"


@pytest.mark.parametrize("size", [1, 7, 4096, 1 << 20])
def test_the_file_comes_out_byte_for_byte_whatever_the_chunking(size: int) -> None:
    form, data = read(field("purpose", b"batch") + file_part(DATA) + END, size)
    assert data == DATA
    assert form.fields == {"purpose": "batch"} and form.filename == "jobs.jsonl"


def test_fields_before_the_file_are_known_before_its_first_byte_is_handed_on() -> None:
    body = field("purpose", b"batch") + field("expires_after[seconds]", b"3600") + file_part(DATA) + END
    form = FormStream(CTYPE, pieces(body, 64), file_field="file", keep=KEEP)
    assert form.read_to_file()
    assert form.fields == {"purpose": "batch", "expires_after[seconds]": "3600"}
    chunks = form.file_chunks()
    first = next(chunks)
    assert DATA.startswith(first) and len(first) < len(DATA)  # streamed: the rest is still unread
    assert first + b"".join(chunks) == DATA


def test_fields_after_the_file_are_read_once_the_file_is_handed_on() -> None:
    form, data = read(file_part(DATA) + field("purpose", b"batch") + END)
    assert data == DATA and form.fields == {"purpose": "batch"}


def test_unknown_fields_are_read_past_and_never_kept() -> None:
    form, data = read(field("other", b"x" * 5000) + field("purpose", b"batch") + file_part(b"{}") + END)
    assert data == b"{}" and form.fields == {"purpose": "batch"}


def test_a_body_without_a_file_part_says_so() -> None:
    body = field("purpose", b"batch") + END
    assert not FormStream(CTYPE, pieces(body, 5), file_field="file", keep=KEEP).read_to_file()
    assert not FormStream("application/json", iter([b"{}"]), file_field="file", keep=KEEP).read_to_file()


def test_a_file_part_without_a_filename_is_still_the_file() -> None:
    form, data = read(field("purpose", b"batch") + field("file", b"{}") + END)
    assert data == b"{}" and form.filename == ""


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (field("purpose", b"batch") + file_part(DATA), "ended inside its file part"),  # cut off mid-file
        (file_part(DATA) + b"--xyz\r\n", "Invalid multipart data"),  # cut off after the file
        (file_part(b"{}") + file_part(b"{}", "two.jsonl") + END, "one 'file' part"),
        (b"not a multipart body at all", "Invalid multipart data"),
        (b"--xyz\r\nContent-Disposition: form-data\r\n\r\nx\r\n" + END, '"name" must be provided'),
        (field("purpose", b"x" * (FIELD_MAX_BYTES + 1)) + file_part(b"{}") + END, "maximum size of 1024KB"),
        (b"".join(field(f"f{i}", b"") for i in range(FIELDS_MAX + 1)) + file_part(b"{}") + END, "Too many fields"),
    ],
)
def test_malformed_bodies_are_a_400_with_starlettes_words(body: bytes, message: str) -> None:
    with pytest.raises(MultipartError, match=message) as error:
        form = FormStream(CTYPE, pieces(body, 1000), file_field="file", keep=KEEP)
        if form.read_to_file():
            b"".join(form.file_chunks())
    assert error.value.status == 400


def test_a_multipart_type_without_a_boundary_is_a_400() -> None:
    with pytest.raises(MultipartError, match="Missing boundary"):
        FormStream("multipart/form-data", iter([b""]), file_field="file", keep=KEEP)


def test_an_utf8_filename_is_decoded_and_a_latin1_one_still_readable() -> None:
    form, _ = read(field("purpose", b"batch") + file_part(b"{}", "r\u00e9sum\u00e9.jsonl") + END)
    assert form.filename == "r\u00e9sum\u00e9.jsonl"
    latin = b'--xyz\r\nContent-Disposition: form-data; name="file"; filename="\xe9.jsonl"\r\n\r\n{}\r\n' + END
    form, _ = read(latin)
    assert form.filename == "\u00e9.jsonl"


@pytest.mark.parametrize("size", [1, 2, 7, 61, 4096, 1 << 20])
def test_the_file_size_is_known_from_the_declared_length_before_its_bytes_are_read(size: int) -> None:
    # An Uploads part: S3 needs the part's length before its first byte; every chunking gives the same answer,
    # including a chunk edge inside the headers, right after them, or inside a boundary look-alike.
    data = b"\r\n--xy" + DATA
    body = field("purpose", b"batch") + file_part(data, name="data") + END
    form = FormStream(CTYPE, pieces(body, size), file_field="data", keep=KEEP)
    assert form.read_to_file()
    assert form.file_size(len(body)) == len(data)
    assert b"".join(form.file_chunks()) == data


def test_no_declared_length_leaves_the_file_size_unknown() -> None:
    body = file_part(DATA, name="data") + END
    form = FormStream(CTYPE, pieces(body, 64), file_field="data", keep=())
    assert form.read_to_file() and form.file_size(None) is None
