"""Anthropic Message Batch line formats: the create body in, result lines out.

In: `{"requests": [{"custom_id", "params"}, ...]}` is read as it streams (`RequestsReader`), one request
at a time, never the whole body: each request's shape is checked and it is written on as one line of
OpenAI's batch format (`url: /v1/messages`, `body: params`), the format ingest reads with the one JSONL
reader and line checker. Shape problems are collected for every request, so the 400 names them all.

Out: one `MessageBatchIndividualResponse` per request, `{custom_id, result}` with `result.type` one of
succeeded (with the `Message`), errored (Anthropic's error response), canceled, expired.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import orjson

from storage.endpoints import MESSAGES_URL
from storage.errors import InvalidRequest, RequestTooLarge
from storage.lines.bounded_json import EXTENSION_MAX_BYTES, REQUESTS_REQUIRED, RequestsSplitter, value_problem
from storage.lines.reader import iter_lines, may_be_unstorable

CUSTOM_ID = re.compile(r"[a-zA-Z0-9_-]{1,64}")  # fullmatch: `$` would let a trailing newline through
MODEL_MAX_CHARS = 200  # batch_requests.model
DESCRIBED_PROBLEMS = 20  # problems spelled out in the 400; every bad index is listed regardless
CHUNK_BYTES = 1024 * 1024
# Backfill extensions a create body may carry beside `requests` (the SDK's `extra_body`), each with its size limit in
# bytes: small scalars (the completion window among them), a trial, and checks (a JSON schema of up to 64 KB, an
# enum of up to 256 strings: 1 MiB).
EXTENSIONS = {
    "completion_window": EXTENSION_MAX_BYTES,
    "priority": EXTENSION_MAX_BYTES,
    "max_cost_usd": EXTENSION_MAX_BYTES,
    "on_expiry": EXTENSION_MAX_BYTES,
    "trial": 1024,
    "checks": 1024 * 1024,
}
RAW_SLACK = 2  # a request as sent may carry white space its stored line drops: held up to twice the line limit
_REQUEST_KEYS = frozenset({"custom_id", "params"})


@dataclass(frozen=True)
class RequestProblem:
    """One request whose shape is wrong: its index in `requests` and what is wrong."""

    index: int
    message: str


class RequestsReader:
    """Streams a create body into internal JSONL lines, checking each request's shape on the way.

    After the lines are consumed, `problems` holds every bad request (`raise_if_bad` turns them into one
    400) and `count`, `first_model`, `mixed_models` describe the batch.
    """

    def __init__(self, *, max_requests: int, max_request_bytes: int, max_body_bytes: int) -> None:
        self.max_requests = max_requests
        self.max_request_bytes = max_request_bytes
        self.max_body_bytes = max_body_bytes
        self.problems: list[RequestProblem] = []
        self.count = 0
        self.body_bytes = 0
        self.first_model: str | None = None
        self.mixed_models = False
        self._custom_ids: dict[str, int] = {}
        self.unknown_keys: list[str] = []
        self.extensions: dict[str, Any] = {}  # Backfill extensions given beside `requests` (EXTENSIONS)

    def lines(self, chunks: Iterable[bytes]) -> Iterator[bytes]:
        """JSONL bytes in ~1 MiB chunks; once a problem is seen, nothing more is yielded (but all is read).

        The body is split into its requests by the one bounded reader (storage/lines/bounded_json.py): depth is
        counted over the bytes before anything is built, and no request is held past its size limit.
        """
        splitter = RequestsSplitter(max_item_bytes=RAW_SLACK * self.max_request_bytes, extensions=EXTENSIONS)
        buffer = bytearray()
        for chunk in chunks:
            self.body_bytes += len(chunk)
            if self.body_bytes > self.max_body_bytes:
                raise RequestTooLarge(f"Request exceeds the maximum size of {self.max_body_bytes} bytes.")
            for raw, problem in splitter.feed(chunk):
                line = self._line(raw, problem)
                if line is not None and not self.problems:
                    buffer += line
            if len(buffer) >= CHUNK_BYTES:
                yield bytes(buffer)
                buffer.clear()
        splitter.close()
        self.unknown_keys = splitter.unknown_keys
        self.extensions = {key: _extension(key, raw) for key, raw in splitter.extension_values.items()}
        if buffer and not self.problems:
            yield bytes(buffer)

    def raise_if_bad(self) -> None:
        """One 400 naming every bad request (the first few described) and unknown fields, or nothing."""
        unknown = "; ".join(f"{key}: Extra inputs are not permitted" for key in self.unknown_keys[:DESCRIBED_PROBLEMS])
        if self.count == 0 and not self.problems:
            raise InvalidRequest(REQUESTS_REQUIRED + (f"; {unknown}" if unknown else ""))
        if not self.problems:
            if unknown:
                raise InvalidRequest(unknown)
            return
        described = "; ".join(problem.message for problem in self.problems[:DESCRIBED_PROBLEMS])
        more = len(self.problems) - DESCRIBED_PROBLEMS
        if more > 0:
            described += f"; and {more} more"
        indices = _ranges([problem.index for problem in self.problems])
        message = f"{len(self.problems)} invalid requests (indices {indices}): {described}"
        raise InvalidRequest(message + (f"; {unknown}" if unknown else ""))

    def _line(self, raw: bytearray | None, problem: str | None) -> bytes | None:
        index = self.count
        self.count += 1
        if self.count > self.max_requests:
            raise InvalidRequest(f"requests: at most {self.max_requests} requests per batch")
        if raw is None:
            self.problems.append(RequestProblem(index, f"requests.{index}: {problem}"))
            return None
        item, problem = _parse_item(raw)
        if problem is not None:
            self.problems.append(RequestProblem(index, f"requests.{index}: {problem}"))
            return None
        problem = self._problem(index, item)
        if problem is not None:
            self.problems.append(RequestProblem(index, problem))
            return None
        internal = {"custom_id": item["custom_id"], "method": "POST", "url": MESSAGES_URL, "body": item["params"]}
        line = orjson.dumps(internal)
        if len(line) > self.max_request_bytes:
            message = f"requests.{index}: larger than {self.max_request_bytes} bytes (BACKFILL_LINE_MAX_BYTES)"
            self.problems.append(RequestProblem(index, message))
            return None
        return line + b"\n"

    def _problem(self, index: int, item: Any) -> str | None:
        """What is wrong with this request's shape (params beyond it are checked when it runs), or None."""
        where = f"requests.{index}"
        if not isinstance(item, dict):
            return f"{where}: must be an object with custom_id and params"
        extra = sorted(set(item) - _REQUEST_KEYS)
        if extra:
            return f"{where}.{extra[0]}: Extra inputs are not permitted"
        custom_id = item.get("custom_id")
        if not isinstance(custom_id, str) or not CUSTOM_ID.fullmatch(custom_id):
            return f"{where}.custom_id: must match ^[a-zA-Z0-9_-]{{1,64}}$"
        if custom_id in self._custom_ids:
            return f"{where}.custom_id: duplicate custom_id {custom_id!r} (also requests.{self._custom_ids[custom_id]})"
        self._custom_ids[custom_id] = index
        params = item.get("params")
        if not isinstance(params, dict):
            return f"{where}.params: Field required (an object of Messages parameters)"
        problem = _params_problem(where, params)
        if problem is None:
            self._note_model(params["model"])
        return problem

    def _note_model(self, model: str) -> None:
        if self.first_model is None:
            self.first_model = model
        elif model != self.first_model:
            self.mixed_models = True


def _extension(key: str, raw: bytes) -> Any:
    """An extension's value, parsed strictly and held to the value rules of any control-plane body."""
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise InvalidRequest(f"{key}: not a valid JSON value.", param=key) from None
    if problem := value_problem(value, allow_nul=False):
        raise InvalidRequest(f"{key}: {problem}.", param=key)
    return value


def _parse_item(raw: bytearray) -> tuple[Any, str | None]:
    """One request's bytes (depth already bounded by the splitter) parsed strictly, with the line rules."""
    try:
        item = orjson.loads(raw)
    except orjson.JSONDecodeError as error:
        return None, f"not valid JSON ({error})"
    return item, value_problem(item, allow_nul=True) if may_be_unstorable(raw) else None


def _params_problem(where: str, params: dict[str, Any]) -> str | None:
    model = params.get("model")
    if not isinstance(model, str) or not model or len(model) > MODEL_MAX_CHARS:
        return f"{where}.params.model: Field required (a model name of at most {MODEL_MAX_CHARS} characters)"
    if "\x00" in model:  # a text column (and Postgres' COPY) cannot hold NUL
        return f"{where}.params.model: contains a NUL character"
    max_tokens = params.get("max_tokens")
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
        return f"{where}.params.max_tokens: Field required (an integer of at least 1)"
    messages = params.get("messages")
    if not isinstance(messages, list) or not messages:
        return f"{where}.params.messages: Field required (a non-empty list of messages)"
    for index, message in enumerate(messages):  # as long as the request's bytes allow (line_max_bytes)
        if not isinstance(message, dict):
            return f"{where}.params.messages.{index}: must be an object with role and content"
    return None


def _ranges(indices: list[int]) -> str:
    """'0-3, 7, 9-10' for [0, 1, 2, 3, 7, 9, 10]."""
    parts: list[str] = []
    start = previous = indices[0]
    for index in [*indices[1:], None]:
        if index is not None and index == previous + 1:
            previous = index
            continue
        parts.append(str(start) if start == previous else f"{start}-{previous}")
        if index is not None:
            start = previous = index
    return ", ".join(parts)


# -- results ---------------------------------------------------------------------------------------------

# HTTP status of a failed request -> Anthropic's error type (the types its SDK's `ErrorObject` knows).
_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    429: "rate_limit_error",
    529: "overloaded_error",
}
# Batch-level refusals (admission) -> the error type Anthropic would have answered at create.
_REFUSAL_TYPES = {"token_limit_exceeded": "rate_limit_error", "deadline_infeasible": "overloaded_error"}
CANCELLED_CODE = "batch_cancelled"
EXPIRED_CODE = "batch_expired"


def error_type(status_code: int | None) -> str:
    """Anthropic's error type for a request that failed with this HTTP status."""
    if status_code is None or status_code >= 500:
        return "api_error"
    return _ERROR_TYPES.get(status_code, "invalid_request_error")


def error_kind(status_code: int | None, error_code: str | None) -> str:
    """What an Anthropic user sees of a request that did not succeed: its result type (`canceled`, `expired`)
    or its error's type (`invalid_request_error`, `api_error`, ...); a retry's `codes` name these."""
    if error_code == CANCELLED_CODE:
        return "canceled"
    if error_code == EXPIRED_CODE:
        return "expired"
    return error_type(status_code)


def errored(kind: str, message: str) -> dict[str, Any]:
    """An `errored` result: Anthropic's error response inside."""
    return {"type": "errored", "error": {"type": "error", "error": {"type": kind, "message": message}}}


def result_line(
    request_id: str,
    custom_id: str,
    status_code: int | None,
    body: dict[str, Any] | None,
    error_code: str | None,
    error_message: str | None,
    attempts: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One `MessageBatchIndividualResponse` from a finished queue row (the row tuple finalize streams); a checked
    line's `attempts` (a Backfill extension) beside its result."""
    result: dict[str, Any]
    if error_code == CANCELLED_CODE:
        result = {"type": "canceled"}
    elif error_code == EXPIRED_CODE:
        result = {"type": "expired"}
    elif status_code is not None and 200 <= status_code < 300 and body is not None:
        result = {"type": "succeeded", "message": body}
    else:
        result = errored(error_type(status_code), error_message or _body_message(body) or "The request failed.")
    line = {"custom_id": custom_id, "result": result}
    if attempts:
        line["attempts"] = attempts
    return line


def _body_message(body: dict[str, Any] | None) -> str | None:
    error = body.get("error") if isinstance(body, dict) else None
    message = error.get("message") if isinstance(error, dict) else None
    return message if isinstance(message, str) else None


def unqueued_results(
    chunks: Iterable[bytes], *, outcome: str, refusal: dict[str, Any] | None, max_line_bytes: int
) -> Iterator[bytes]:
    """Result lines for a batch that ended before its requests were queued (cancelled or expired while
    validating, or refused at admission), read off its internal input: `outcome` is canceled, expired or
    errored (with the batch-level `refusal` {code, message} as the error)."""
    if outcome == "errored":
        code = (refusal or {}).get("code") or ""
        message = (refusal or {}).get("message") or "The batch could not be processed."
        result = errored(_REFUSAL_TYPES.get(code, "invalid_request_error"), message)
    else:
        result = {"type": outcome}
    for _, raw in iter_lines(chunks, max_line_bytes=max_line_bytes):
        if raw:
            custom_id = orjson.loads(raw).get("custom_id")
            yield orjson.dumps({"custom_id": custom_id, "result": result}) + b"\n"
