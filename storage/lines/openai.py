"""OpenAI's batch line formats: `BatchRequestLine` in (the queue's input format for both protocols), and
`BatchResultLine` out (the lines of an output or error file, one per request).

The one reader and the one checker of input lines are protocol-neutral (storage/lines/reader.py); each other
protocol's formats have a module of their own beside this one.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

CUSTOM_ID_MAX_CHARS = 512


class BatchRequestLine(BaseModel):
    """One input line: `{"custom_id", "method": "POST", "url", "body": {"model", ...}}`.

    `LineChecker` enforces exactly these rules on the ingest path (fast, with a precise code per problem);
    this model is their declaration, and a property test keeps the two in agreement.
    """

    model_config = ConfigDict(extra="ignore")

    custom_id: str = Field(min_length=1, max_length=CUSTOM_ID_MAX_CHARS)
    method: Literal["POST"]
    url: str
    body: dict[str, Any]


class ResultResponse(BaseModel):
    """The response part of a result line: the HTTP status and body the endpoint answered."""

    status_code: int
    request_id: str
    body: dict[str, Any] | None


class ResultError(BaseModel):
    """The error part of a result line, for requests that never got a response (expired, cancelled, ...)."""

    code: str | None
    message: str | None


class BatchResultLine(BaseModel):
    """One line of an output or error file, as OpenAI writes them."""

    id: str
    custom_id: str
    response: ResultResponse | None
    error: ResultError | None
    attempts: dict[str, Any] | None = None  # Backfill extension: a checked line's attempts (docs/workflow.md)


def result_line(
    request_id: str,
    custom_id: str,
    status_code: int | None,
    body: dict[str, Any] | None,
    error_code: str | None,
    error_message: str | None,
    attempts: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A `BatchResultLine` as a plain dict (built directly: output files are written at ~40,000 lines/s); a checked
    line's `attempts` (a Backfill extension: how many answers were drawn, which check each failed one failed)."""
    response = None
    if status_code is not None:
        response = {"status_code": status_code, "request_id": request_id, "body": body}
    error = {"code": error_code, "message": error_message} if error_code else None
    line = {"id": request_id, "custom_id": custom_id, "response": response, "error": error}
    if attempts:
        line["attempts"] = attempts
    return line


def error_kind(status_code: int | None, error_code: str | None) -> str | None:
    """What an OpenAI user sees of a request that did not succeed: its error line's `error.code`."""
    return error_code
