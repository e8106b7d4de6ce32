"""The one JSONL reader and the one line checker.

`iter_lines` is the only way a JSONL stream is split into lines (bounded: an over-long line is reported, never
buffered whole); `LineChecker` is the only judge of a line, used by ingest and by the estimate alike. The lines
it checks are the queue's input format, OpenAI's batch line (storage/lines/openai.py), which a create body
with inline requests is also written as (by its protocol's line format). Per-line problems are data (`LineError`), never
exceptions: validation reports every bad line with its number.
"""

from __future__ import annotations

import codecs
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from storage.endpoints import canonical_url
from storage.lines.openai import CUSTOM_ID_MAX_CHARS

BOM = "\ufeff"
# A line nests at most this deep (the line's own object is level 1). orjson reads 1024 levels but writes
# only 254, and the queue stores bodies through orjson: anything deeper would fail at ingest, not here.
LINE_MAX_DEPTH = 64
# Every integer of a line fits a signed 64-bit column and orjson's writer (which stops at 2^64 - 1).
INT_MIN, INT_MAX = -(2**63), 2**63 - 1
ECHO_MAX_CHARS = 200  # how much of an offending value an error message repeats
PROBLEMS_MAX = 100  # line problems a batch keeps (`errors.data`); one more entry counts the rest


@dataclass(frozen=True)
class LineError:
    """One bad line: OpenAI's batch error entry {code, message, param, line}."""

    line: int
    code: str
    message: str
    param: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"code": self.code, "message": self.message, "param": self.param, "line": self.line}


class ProblemList:
    """A batch's line problems as stored: the first `limit` in line order, and how many there were in all.

    A file of 50,000 bad lines must not make a 50,000-entry batch object: `to_json` keeps OpenAI's
    `errors.data` shape with the first `limit` entries and, past them, one `too_many_errors` entry
    (no line) that says how many more there were.
    """

    def __init__(self, *, limit: int = PROBLEMS_MAX) -> None:
        self.limit = limit
        self.kept: list[LineError] = []
        self.total = 0

    def __bool__(self) -> bool:
        return self.total > 0

    def add(self, error: LineError) -> None:
        """Count the problem; keep it if fewer than `limit` are kept."""
        self.total += 1
        if len(self.kept) < self.limit:
            self.kept.append(error)

    def to_json(self) -> list[dict[str, Any]]:
        """The kept entries, plus a summary entry when some were left out."""
        entries = [error.to_json() for error in self.kept]
        hidden = self.total - len(self.kept)
        if hidden:
            message = (
                f"{hidden:,} more lines have errors ({self.total:,} in all); the first {len(self.kept)} are shown."
            )
            entries.append({"code": "too_many_errors", "message": message, "param": None, "line": None})
        return entries


def clip(value: object, limit: int = ECHO_MAX_CHARS) -> str:
    """`repr` of a value for an error message, cut to `limit` characters (an echo never amplifies input)."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


# A 19-digit run, found as a substring once every digit reads "9" and everything else " ": bytes.translate
# and `in` run in C over a 4 KB line in a few microseconds, a regex search took 35 (40% of ingest's time).
_DIGITS_AS_NINES = bytes(57 if 48 <= byte <= 57 else 32 for byte in range(256))
_LONG_NUMBER = b"9" * 19


def may_be_unstorable(raw: bytes | bytearray) -> bool:
    """Cheap pre-test on the bytes: too few brackets to nest too deep and no 19-digit run: nothing to walk."""
    return raw.count(b"[") + raw.count(b"{") > LINE_MAX_DEPTH or _LONG_NUMBER in raw.translate(_DIGITS_AS_NINES)


def shape_problem(item: Any, *, max_depth: int = LINE_MAX_DEPTH) -> str | None:
    """Why a parsed line cannot be stored ('too_deeply_nested' or 'integer_out_of_range'), else None.

    Iterative, so a 1,024-level line costs one pass and no Python recursion.
    """
    stack: list[tuple[Any, int]] = [(item, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, dict):
            if depth > max_depth:
                return "too_deeply_nested"
            stack.extend((child, depth + 1) for child in value.values())
        elif isinstance(value, list):
            if depth > max_depth:
                return "too_deeply_nested"
            stack.extend((child, depth + 1) for child in value)
        elif isinstance(value, int) and not INT_MIN <= value <= INT_MAX:
            return "integer_out_of_range"
    return None


@dataclass(frozen=True)
class ParsedLine:
    """A valid line, ready to become a queue row."""

    line: int
    custom_id: str
    model: str
    url: str
    body: dict[str, Any]


def iter_lines(chunks: Iterable[bytes], *, max_line_bytes: int) -> Iterator[tuple[int, bytes | None]]:
    """Yield (line number, raw bytes) for each line; None for a line longer than `max_line_bytes`.

    Handles CRLF, a missing final newline, and never holds more than one over-long line's prefix.
    """
    buffer = bytearray()
    number = 0
    too_long = False
    for chunk in chunks:
        start = 0
        while True:
            end = chunk.find(b"\n", start)
            if end < 0:
                if not too_long:
                    buffer += chunk[start:]
                    if len(buffer) > max_line_bytes:
                        too_long = True
                        buffer.clear()
                break
            number += 1
            if too_long or len(buffer) + (end - start) > max_line_bytes:
                yield number, None
            else:
                buffer += chunk[start:end]
                yield number, bytes(buffer.removesuffix(b"\r"))
            buffer.clear()
            too_long = False
            start = end + 1
    if too_long:
        yield number + 1, None
    elif buffer.strip():
        yield number + 1, bytes(buffer.removesuffix(b"\r"))


def decode_line(raw: bytes, *, first: bool) -> str:
    """UTF-8 text of a line, without a leading byte-order mark on the first line."""
    text = raw.decode("utf-8")
    return text.removeprefix(BOM) if first else text


class LineChecker:
    """Checks lines one at a time, remembering custom_ids and the batch's model across lines.

    `endpoint` and `model` are the batch's (decided when it was created); with either left None the first
    valid line sets it, for callers that size a file before a batch exists (the estimate, the CLI).
    `one_model=False` lets each line name its own model (a protocol whose batches may mix models).
    `track_duplicates=False` leaves duplicate custom_ids to the caller (ingest lets the queue's unique index
    find them, so its memory does not grow with the file, and re-checks with tracking when it fires).
    `default_models` (url -> model) names the model of a line of that url whose body names none (OpenAI's
    `/v1/moderations`, where `model` is optional).
    """

    def __init__(
        self,
        *,
        endpoint: str | None,
        max_requests: int,
        model: str | None = None,
        one_model: bool = True,
        track_duplicates: bool = True,
        default_models: Mapping[str, str] | None = None,
    ) -> None:
        self.endpoint = endpoint
        self.default_models = default_models or {}
        self.max_requests = max_requests
        self.custom_ids: set[str] = set()
        self.track_duplicates = track_duplicates
        self.model = model
        self.one_model = one_model
        self.count = 0
        self.accepted = 0  # lines that became a ParsedLine

    def check(self, number: int, raw: bytes | None, *, max_line_bytes: int) -> ParsedLine | LineError | None:
        """A ParsedLine, a LineError, or None for a blank line (skipped)."""
        if raw is None:
            return LineError(
                number,
                "line_too_large",
                f"Line {number} is longer than {max_line_bytes} bytes (BACKFILL_LINE_MAX_BYTES; an inline base64 image "
                "counts toward it: a large one can go as an https URL).",
            )
        try:
            text = decode_line(raw, first=number == 1)
        except UnicodeDecodeError:
            return LineError(number, "invalid_encoding", f"Line {number} is not valid UTF-8.")
        if not text.strip():
            return None
        self.count += 1
        if self.count == self.max_requests + 1:
            return LineError(number, "too_many_requests", f"The file has more than {self.max_requests} requests.")
        try:
            item = orjson.loads(text)
        except orjson.JSONDecodeError as error:
            if "depth limit exceeded" in str(error):  # orjson stops at 1024 levels: valid JSON, but far too deep
                return LineError(
                    number, "too_deeply_nested", f"Line {number} nests deeper than {LINE_MAX_DEPTH} levels.", "body"
                )
            return LineError(number, "invalid_json", f"Line {number} is not valid JSON: {error}.")
        if not isinstance(item, dict):
            return LineError(number, "invalid_json", f"Line {number} must be a JSON object.")
        problem = shape_problem(item) if may_be_unstorable(raw) else None
        if problem == "too_deeply_nested":
            message = f"Line {number} nests deeper than {LINE_MAX_DEPTH} levels."
            return LineError(number, problem, message, "body")
        if problem == "integer_out_of_range":
            message = f"Line {number} has an integer outside the signed 64-bit range."
            return LineError(number, problem, message, "body")
        return self._check_fields(number, item)

    def _check_fields(self, number: int, item: dict[str, Any]) -> ParsedLine | LineError:
        custom_id = item.get("custom_id")
        if not isinstance(custom_id, str) or not custom_id:
            return LineError(number, "missing_required_parameter", "Missing 'custom_id'.", "custom_id")
        if len(custom_id) > CUSTOM_ID_MAX_CHARS:
            message = f"'custom_id' is longer than {CUSTOM_ID_MAX_CHARS} characters."
            return LineError(number, "invalid_custom_id", message, "custom_id")
        if "\x00" in custom_id:  # a text column (and Postgres' COPY) cannot hold NUL
            return LineError(number, "invalid_custom_id", "'custom_id' contains a NUL character.", "custom_id")
        if self.track_duplicates:
            if custom_id in self.custom_ids:
                message = f"Duplicate custom_id {clip(custom_id)}."
                return LineError(number, "duplicate_custom_id", message, "custom_id")
            self.custom_ids.add(custom_id)
        if item.get("method") != "POST":
            return LineError(number, "invalid_method", "'method' must be 'POST'.", "method")
        url = item.get("url")
        url = canonical_url(url) if isinstance(url, str) else url
        if not isinstance(url, str) or (self.endpoint is not None and url != self.endpoint):
            message = f"'url' is {clip(url)} but the batch endpoint is '{self.endpoint}'."
            return LineError(number, "mismatched_url", message, "url")
        self.endpoint = url
        body = item.get("body")
        if not isinstance(body, dict):
            return LineError(number, "invalid_body", "'body' must be a JSON object.", "body")
        model = body.get("model")
        if model is None:
            model = self.default_models.get(url)
        if not isinstance(model, str) or not model:
            return LineError(number, "missing_required_parameter", "Missing 'body.model'.", "body.model")
        if self.one_model and self.model is None:
            self.model = model
        elif self.one_model and model != self.model:
            message = f"Model {clip(model)} differs from {clip(self.model)}: one batch serves one model."
            return LineError(number, "mismatched_model", message, "body.model")
        self.accepted += 1
        return ParsedLine(number, custom_id, model, url, body)


def check_utf8_jsonl(chunks: Iterable[bytes]) -> Iterator[bytes]:
    """Pass chunks through, raising ValueError if the stream is not UTF-8 or does not start like JSONL."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    seen_first = False
    for chunk in chunks:
        if seen_first and chunk.isascii() and not decoder.getstate()[0]:
            yield chunk  # ASCII is UTF-8: no text is built (most JSONL is ASCII, escapes included)
            continue
        try:
            text = decoder.decode(chunk)
        except UnicodeDecodeError:
            raise ValueError("The file is not UTF-8 text: upload a JSONL file for purpose 'batch'.") from None
        if not seen_first and text.lstrip(BOM + " \t\r\n"):
            seen_first = True
            if not text.lstrip(BOM + " \t\r\n").startswith("{"):
                raise ValueError("The file is not JSONL: each line must be a JSON object.")
        yield chunk
    try:
        decoder.decode(b"", final=True)
    except UnicodeDecodeError:
        raise ValueError("The file is not UTF-8 text: upload a JSONL file for purpose 'batch'.") from None


def peek_model(
    chunks: Iterable[bytes], *, max_line_bytes: int, default_models: Mapping[str, str] | None = None
) -> str | None:
    """The `body.model` of the first parseable line (a body naming none: its url's default model), or None
    (validation then reports why)."""
    for number, raw in iter_lines(chunks, max_line_bytes=max_line_bytes):
        if raw is None:
            return None
        try:
            text = decode_line(raw, first=number == 1)
            if not text.strip():
                continue
            item = orjson.loads(text)
        except orjson.JSONDecodeError:
            return None
        body = item.get("body") if isinstance(item, dict) else None
        model = body.get("model") if isinstance(body, dict) else None
        if model is None and isinstance(body, dict):
            model = (default_models or {}).get(canonical_url(str(item.get("url"))))
        return model if isinstance(model, str) else None
    return None
