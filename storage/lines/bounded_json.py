"""The one bounded reader of JSON request bodies: depth counted over the bytes as they stream, before
anything is built; then strict parsing (orjson: valid UTF-8, no lone surrogates) and the line checker's
value rules (integers in the signed 64-bit range, no NUL in control-plane strings).

Two shapes use it. Every small JSON body (batch create, estimate, webhook endpoints) goes through
`check_body` in the API's request-limits middleware (api/limits.py). A create body that holds its
requests inline (hundreds of MB) is split into its `requests` items by `RequestsSplitter` without ever holding
more than one item (capped) in memory; each item is then parsed and checked on its own (by its protocol's line
format, storage/lines/).

Depth is counted the way the line checker counts it: the outermost value is level 1. No Python
recursion, no path prefixes: a body of 100,000 `[` costs one pass and a few integers.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from typing import Any

import orjson

from storage.errors import InvalidRequest
from storage.lines.reader import INT_MAX, INT_MIN, LINE_MAX_DEPTH, clip

BODY_MAX_DEPTH = LINE_MAX_DEPTH  # a control-plane body nests no deeper than a batch line may

# Outside strings, inside values we only walk: just what changes depth or enters a string.
# Outside strings, at the levels we interpret: a structural byte, or a whole run of scalar bytes.
_SHALLOW = re.compile(rb'["\[\]{},:]|[^ \t\r\n"\[\]{},:]+')
_IN_STRING = re.compile(rb'["\\]')
# Inside a value we only walk: a whole string (group 1 is its closing quote, empty when the chunk ends
# first), or a bracket.
# a bracket run: `[[[[` is one match, so a deep body costs one step, not one per level.
_DEEP_TOKEN = re.compile(rb'"(?:[^"\\]++|\\.)*+("?)|[\[{]++|[\]}]++', re.DOTALL)
_OPEN = frozenset(b"[{")
_STRUCTURAL = frozenset(b'"[]{},:')
EXTENSION_MAX_BYTES = 64  # a top-level extension's value by default (a number or a short string)
REQUESTS_REQUIRED = 'requests: List should have at least 1 item ({"requests": [{"custom_id", "params"}]})'


class TooDeep(InvalidRequest):
    """A body nests deeper than the limit: refused before it is parsed."""

    code = "too_deeply_nested"


class _Strings:
    """String state across chunks: inside a string, only its closing quote (past escapes) matters."""

    _in_string = False
    _escape = False

    def _skip_string(self, chunk: bytes, pos: int) -> int:
        if self._escape:
            self._escape = False
            return pos + 1
        match = _IN_STRING.search(chunk, pos)
        if match is None:
            return len(chunk)
        if chunk[match.start()] == 0x5C:  # backslash: the next byte is escaped, maybe in the next chunk
            self._escape = True
            return match.end()
        self._in_string = False
        self._string_ended(chunk, match.start())
        return match.end()

    def _string_ended(self, chunk: bytes, end: int) -> None:
        """Called where a string that began in an earlier step closes."""


class DepthCounter(_Strings):
    """Tracks nesting depth and string state across chunks; raises `TooDeep` past `max_depth`."""

    def __init__(self, *, max_depth: int = BODY_MAX_DEPTH) -> None:
        self.max_depth = max_depth
        self.depth = 0
        self._in_string = False
        self._escape = False

    def feed(self, chunk: bytes) -> None:
        """Walk one chunk of the body."""
        pos = 0
        while self._in_string and pos < len(chunk):  # a string from the previous chunk
            pos = self._skip_string(chunk, pos)
        if self._in_string:
            return
        for match in _DEEP_TOKEN.finditer(chunk, pos):
            start, end = match.span()
            if chunk[start] == 0x22:
                if not match.group(1):  # the string goes on in the next chunk
                    self._in_string, self._escape = True, end < len(chunk)
                    return
            elif chunk[start] in _OPEN:
                self.depth += end - start
                if self.depth > self.max_depth:
                    raise TooDeep(f"The request body nests deeper than {self.max_depth} levels.")
            else:
                self.depth -= end - start


def parse_checked(raw: bytes, *, what: str = "The request body", allow_nul: bool = False) -> Any:
    """Parse bytes whose depth is already bounded; InvalidRequest for invalid JSON (bad UTF-8, lone
    surrogates), integers outside 64 bits, nesting past the limit, or (unless allowed) NUL characters."""
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError as error:
        raise InvalidRequest(f"{what} is not valid JSON: {error}") from None
    problem = value_problem(value, allow_nul=allow_nul)
    if problem is not None:
        raise InvalidRequest(f"{what} {problem}.")
    return value


def value_problem(value: Any, *, allow_nul: bool, max_depth: int = BODY_MAX_DEPTH) -> str | None:
    """What breaks the value rules ('nests deeper than …', 'has an integer …', 'contains a NUL …'), or None.

    Iterative: one pass, no recursion, whatever the shape.
    """
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            if depth > max_depth:
                return f"nests deeper than {max_depth} levels"
            for key, child in item.items():
                if not allow_nul and "\x00" in key:
                    return f"contains a NUL character in the key {clip(key)}"
                stack.append((child, depth + 1))
        elif isinstance(item, list):
            if depth > max_depth:
                return f"nests deeper than {max_depth} levels"
            stack.extend((child, depth + 1) for child in item)
        elif isinstance(item, bool):
            continue
        elif isinstance(item, int) and not INT_MIN <= item <= INT_MAX:
            return "has an integer outside the signed 64-bit range"
        elif not allow_nul and isinstance(item, str) and "\x00" in item:
            return "contains a NUL character in a string"
    return None


def check_body(chunks: list[bytes]) -> bytes:
    """A whole small body (already size-limited), walked for depth then parsed and checked; the bytes back."""
    counter = DepthCounter()
    for chunk in chunks:
        counter.feed(chunk)
    raw = b"".join(chunks)
    parse_checked(raw)
    return raw


class RequestsSplitter(_Strings):
    """Splits `{"requests": [item, item, ...]}` as it streams into the raw bytes of each item.

    Holds at most one item, and only up to `max_item_bytes`: a larger item, or one nesting deeper than
    `max_item_depth` (the item itself is level 1, as a line is), ends as (None, problem), its remaining
    bytes walked and dropped. Other top-level keys are walked (never built) and listed in `unknown_keys`.
    A body that is not an object, or whose `requests` is not an array, or whose own structure is not JSON,
    is refused at once (InvalidRequest): each item's own JSON is judged by the caller's parser.
    """

    def __init__(
        self, *, max_item_bytes: int, max_item_depth: int = LINE_MAX_DEPTH, extensions: Mapping[str, int] | None = None
    ) -> None:
        self.max_item_bytes = max_item_bytes
        self.max_item_depth = max_item_depth
        # top-level keys whose values are kept (`extension_values`), each with its size limit in bytes
        self.extensions: Mapping[str, int] = extensions or {}
        self.extension_values: dict[str, bytes] = {}
        self.unknown_keys: list[str] = []
        self._ext_key: str | None = None  # the extension whose value is being read
        self._ext_cap = EXTENSION_MAX_BYTES  # its size limit
        self._ext = bytearray()
        self._ext_from = -1
        self._scalar_tail = False  # the last token was a scalar run that reached the chunk's end
        self._depth = 0
        self._in_string = False
        self._escape = False
        self._state = "start"  # start, key_or_end, key, colon, value, skip, comma, done; first, next, item
        self._requests_seen = False
        self._key: bytearray | None = None  # a top-level key being read
        self._key_was_requests = False
        self._key_from = 0
        self._item = bytearray()
        self._item_from = -1  # where the current item starts in the current chunk (-1: no item)
        self._item_problem: str | None = None

    def feed(self, chunk: bytes) -> Iterator[tuple[bytearray | None, str | None]]:
        """Walk one chunk; yield (item bytes, None) or (None, problem) for each item that ended in it."""
        pos, end = 0, len(chunk)
        while pos < end:
            if self._in_string:
                pos = self._skip_string(chunk, pos)
            elif self._depth >= 3 or self._state == "skip":
                pos = self._walk(chunk, pos)
            else:
                match = _SHALLOW.search(chunk, pos)
                if match is None:
                    break
                pos = match.end()
                ended = self._token(chunk, match.start(), pos)
                if ended is not None:
                    yield ended
        if self._item_from >= 0:  # the item goes on in the next chunk
            self._append(chunk[self._item_from :])
            self._item_from = 0
        if self._ext_from >= 0:  # an extension's value goes on in the next chunk
            self._ext += chunk[self._ext_from :][: self._ext_cap + 1 - len(self._ext)]
            self._ext_from = 0
        if self._key is not None:
            self._key += chunk[self._key_from : self._key_from + 256 - len(self._key)]
            self._key_from = 0

    def close(self) -> None:
        """The body ended: it must end where a JSON object does."""
        if self._state != "done" or self._in_string:
            pending = f" (and its last request {self._item_problem})" if self._item_problem else ""
            raise InvalidRequest(f"The request body is not valid JSON: it ends before its object closes{pending}.")

    def _string_ended(self, chunk: bytes, end: int) -> None:
        if self._key is not None:  # a top-level key just closed
            self._end_key(chunk, end)

    def _walk(self, chunk: bytes, pos: int) -> int:
        """Inside an item or a skipped value: only strings and depth matter until it closes.

        One regex match per whole string or bracket, in one loop: this is the hot path of a 256 MB body.
        """
        stop = 1 if self._state == "skip" else 2
        for match in _DEEP_TOKEN.finditer(chunk, pos):
            start, end = match.span()
            if chunk[start] == 0x22:
                if match.group(1):
                    continue  # a whole string
                self._in_string = True  # the string goes on in the next chunk
                self._escape = end < len(chunk)  # it stopped before a final backslash
                return len(chunk)
            if chunk[start] in _OPEN:
                self._depth += end - start
                if self._depth - 2 > self.max_item_depth:
                    self._too_deep()
            elif self._depth - (end - start) > stop:
                self._depth -= end - start
            else:  # the value closes inside this run: stop right after its closing bracket
                closing = start + self._depth - stop
                self._depth = stop
                if stop == 1:
                    self._state = "comma"
                return closing
        return len(chunk)

    def _too_deep(self) -> None:
        if self._state == "skip":
            raise TooDeep(f"The request body nests deeper than {self.max_item_depth + 2} levels.")
        if self._item_problem is None:
            self._drop(f"nests deeper than {self.max_item_depth} levels")

    def _token(self, chunk: bytes, start: int, end: int) -> tuple[bytearray | None, str | None] | None:
        byte, state = chunk[start], self._state
        scalar = byte not in _STRUCTURAL
        if self._scalar_tail and start == 0 and scalar:  # a number cut by the chunk boundary goes on
            self._scalar_tail = end == len(chunk)
            return None
        self._scalar_tail = scalar and end == len(chunk) and state in ("value", "comma")
        if state in ("first", "next", "item"):
            return self._in_array(chunk, start, byte)
        if state == "start":
            if byte != 0x7B:
                raise InvalidRequest(REQUESTS_REQUIRED)
            self._depth, self._state = 1, "key_or_end"
        elif state in ("key_or_end", "key"):
            if byte == 0x7D and state == "key_or_end":
                self._depth, self._state = 0, "done"
            else:
                self._expect(byte == 0x22)
                self._in_string, self._key, self._key_from = True, bytearray(), end
        elif state == "colon":
            self._expect(byte == 0x3A)
            self._state = "value"
        elif state == "value":
            if self._ext_key is not None:
                self._ext, self._ext_from = bytearray(), start
            self._value(byte)
        elif state == "comma":
            self._expect(byte in (0x2C, 0x7D))
            if self._ext_key is not None:
                self._end_extension(chunk, start)
            self._state = "key" if byte == 0x2C else "done"
            self._depth = 1 if byte == 0x2C else 0
        else:
            self._expect(False)  # anything after the object closed
        return None

    def _value(self, byte: int) -> None:
        if self._key_was_requests:
            if byte != 0x5B:
                raise InvalidRequest(REQUESTS_REQUIRED)
            self._depth, self._state = 2, "first"
            return
        self._expect(byte not in b",:]}")
        if byte in _OPEN:
            self._depth, self._state = 2, "skip"
        else:
            self._in_string = byte == 0x22
            self._state = "comma"

    def _in_array(self, chunk: bytes, start: int, byte: int) -> tuple[bytearray | None, str | None] | None:
        if self._state == "item" and byte in (0x2C, 0x5D):  # ',' or ']' ends the item
            self._append(chunk[self._item_from : start])
            ended = (None, self._item_problem) if self._item_problem else (self._item, None)
            self._item, self._item_from, self._item_problem = bytearray(), -1, None
            self._state = "next" if byte == 0x2C else "comma"
            self._depth = 2 if byte == 0x2C else 1
            return ended
        if self._state == "first" and byte == 0x5D:  # an empty array
            self._depth, self._state = 1, "comma"
            return None
        self._expect(byte not in b",:]}")
        if self._state != "item":  # a new item starts here
            self._state, self._item_from = "item", start
        if byte in _OPEN:
            self._depth = 3
        elif byte == 0x22:
            self._in_string = True
        return None

    def _end_key(self, chunk: bytes, end: int) -> None:
        assert self._key is not None
        self._key += chunk[self._key_from : max(self._key_from, min(end, self._key_from + 256 - len(self._key)))]
        raw, self._key = bytes(self._key), None
        try:
            key = orjson.loads(b'"' + raw + b'"')
        except orjson.JSONDecodeError:
            key = raw.decode("utf-8", "replace")
        self._key_was_requests = key == "requests"
        if self._key_was_requests:
            if self._requests_seen:
                raise InvalidRequest("requests: given more than once.")
            self._requests_seen = True
        elif key in self.extensions:
            if key in self.extension_values:
                raise InvalidRequest(f"{key}: given more than once.")
            self._ext_key, self._ext_cap = key, self.extensions[key]
        else:
            self.unknown_keys.append(key[:80])
        self._state = "colon"

    def _end_extension(self, chunk: bytes, end: int) -> None:
        """An extension's value ended at `end`: keep its bytes (anything longer than its limit is refused)."""
        assert self._ext_key is not None
        self._ext += chunk[self._ext_from : end][: self._ext_cap + 1 - len(self._ext)]
        if len(self._ext) > self._ext_cap:
            raise InvalidRequest(f"{self._ext_key}: longer than {self._ext_cap} bytes.", param=self._ext_key)
        self.extension_values[self._ext_key] = bytes(self._ext).strip()
        self._ext_key, self._ext, self._ext_from = None, bytearray(), -1

    def _append(self, piece: bytes) -> None:
        if self._item_problem is not None:
            return
        if len(self._item) + len(piece) > self.max_item_bytes:
            self._drop(f"larger than {self.max_item_bytes} bytes")
        else:
            self._item += piece

    def _drop(self, problem: str) -> None:
        self._item_problem, self._item = problem, bytearray()

    @staticmethod
    def _expect(ok: bool) -> None:
        if not ok:
            raise InvalidRequest("The request body is not valid JSON.")
