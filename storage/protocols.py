"""One object per protocol (OpenAI's Batch API, Anthropic's Message Batches): everything that differs between them.

A batch row names its protocol (`batches.protocol`); every place that used to compare that string reads the
object instead: its id prefix, the endpoints its lines may target, whether a batch runs one model, its request
limit, the result files finalize writes and the renderer of their lines. The endpoint URLs are spelled here
and nowhere else in storage/ and worker/.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal
from typing import Protocol as Structural

from storage.lines import anthropic as anthropic_lines
from storage.lines import openai as openai_lines

if TYPE_CHECKING:
    from storage.settings import Settings

from storage.endpoints import (
    CHAT_URL,
    COMPLETIONS_URL,
    EMBEDDINGS_URL,
    MESSAGES_URL,
    MODERATIONS_URL,
    RESPONSES_URL,
)

RenderLine = Callable[..., dict[str, Any]]
# The objects finalize writes under a batch's folder (storage/files/blobs/layout.py names their keys).
BatchObject = Literal["output.jsonl", "errors.jsonl", "manifest.json"]


class HasProtocol(Structural):
    """A row with a `protocol` column (a batch): models.py sits above this table, so it is not imported here."""

    @property
    def protocol(self) -> str: ...


@dataclass(frozen=True)
class ResultFile:
    """One result file finalize writes: which requests it holds, its file purpose and its object name."""

    kind: str  # "output", "errors", "results": the key finalize records the file under
    successes: bool  # holds the completed requests
    failures: bool  # holds the failed, expired and cancelled ones
    purpose: str
    name: BatchObject  # the object's name under the batch's folder


@dataclass(frozen=True)
class Protocol:
    """What one API's batches are: see the module docstring."""

    name: str  # the value of `batches.protocol`
    id_prefix: str
    endpoints: tuple[str, ...]
    one_model: bool  # a batch runs one model (OpenAI); else each request names its own (Anthropic)
    max_requests: Callable[[Settings], int]
    result_files: tuple[ResultFile, ...]
    render_line: RenderLine  # one queue row -> one line of its result file
    # (response status, internal error code) of a request that did not succeed -> the code its users see
    # (OpenAI: the error line's code; Anthropic: `canceled`, `expired` or the error's type): a retry's `codes`.
    error_kind: Callable[[int | None, str | None], str | None]

    api_path: str  # where its batches live in the API: `{api_path}/{batch id}` and its control routes
    # What its API calls a batch's status, and its name for each of storage/lifecycle.py's statuses
    # (None: those names as they are). Errors about a batch's status speak the caller's protocol.
    status_field: str = "status"
    status_names: Mapping[str, str] | None = None
    results_route: str | None = None  # `{api_path}/{id}/{results_route}` streams its results (None: its files)
    # A create whose body holds the requests themselves (its path; None: the requests are an uploaded file), and
    # that body's limit, which the API's request limits apply before the route reads it (api/limits.py).
    streamed_create: str | None = None
    streamed_create_max_bytes: Callable[[Settings], int] = lambda settings: 0
    streamed_estimate: str | None = None  # the dry run of that create: the same body, the same limit
    internal_purposes: tuple[str, ...] = ()  # files it keeps for itself, not listed at /v1/files
    # How long an ended batch's results are kept before the batch is archived (None: as long as its files live).
    results_retention: Callable[[Settings], int | None] = lambda settings: None
    endpoint_label: str | None = None  # what the console shows instead of the batch's endpoint

    def batch_path(self, batch_id: str) -> str:
        """The API path of one of its batches."""
        return f"{self.api_path}/{batch_id}"

    def results_path(self, batch_id: str) -> str | None:
        """The API path that streams a batch's results, if this protocol has one (else they are its files)."""
        return None if self.results_route is None else f"{self.batch_path(batch_id)}/{self.results_route}"

    def keeps_every_request_in_one_file(self) -> bool:
        """Whether its one result file holds every request (successes and failures alike)."""
        return len(self.result_files) == 1 and self.result_files[0].successes and self.result_files[0].failures

    def owns(self, protocol: str) -> bool:
        """Whether a batch row's `protocol` column names this protocol."""
        return protocol == self.name

    def shown_status(self, status: str) -> str:
        """A batch status as this protocol's API shows it (Anthropic: its `processing_status`)."""
        return status if self.status_names is None else self.status_names[status]


OPENAI = Protocol(
    name="openai",
    id_prefix="batch_",
    endpoints=(CHAT_URL, COMPLETIONS_URL, EMBEDDINGS_URL, RESPONSES_URL, MODERATIONS_URL),
    one_model=True,
    max_requests=lambda settings: settings.batch_max_requests,
    result_files=(
        ResultFile("output", successes=True, failures=False, purpose="batch_output", name="output.jsonl"),
        ResultFile("errors", successes=False, failures=True, purpose="batch_output", name="errors.jsonl"),
    ),
    render_line=openai_lines.result_line,
    error_kind=openai_lines.error_kind,
    api_path="/v1/batches",
)
# Anthropic's `processing_status` of each batch status (the statuses of storage/lifecycle.py).
_PROCESSING_STATUS = {
    "validating": "in_progress",
    "in_progress": "in_progress",
    "finalizing": "in_progress",
    "cancelling": "canceling",
    **dict.fromkeys(("completed", "failed", "expired", "cancelled"), "ended"),
}
# One results file with every request, in Anthropic's line format; requests may each name their own model.
ANTHROPIC = Protocol(
    name="anthropic",
    id_prefix="msgbatch_",
    endpoints=(MESSAGES_URL,),
    one_model=False,
    max_requests=lambda settings: settings.message_batch_max_requests,
    result_files=(
        ResultFile("results", successes=True, failures=True, purpose="message_batch_results", name="output.jsonl"),
    ),
    render_line=anthropic_lines.result_line,
    error_kind=anthropic_lines.error_kind,
    status_field="processing_status",
    status_names=_PROCESSING_STATUS,
    api_path="/v1/messages/batches",
    results_route="results",
    streamed_create="/v1/messages/batches",
    streamed_estimate="/v1/messages/batches/estimate",
    streamed_create_max_bytes=lambda settings: settings.message_batch_max_bytes,
    internal_purposes=("message_batch_input", "message_batch_results"),
    results_retention=lambda settings: settings.message_batch_retention_seconds,
    endpoint_label="messages",
)
PROTOCOLS = {protocol.name: protocol for protocol in (OPENAI, ANTHROPIC)}


def protocol_of(batch: HasProtocol) -> Protocol:
    """The protocol a batch (anything with a `protocol` column) was created through; OpenAI for old rows."""
    return PROTOCOLS.get(batch.protocol, OPENAI)
