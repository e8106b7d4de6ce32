"""The Engine protocol: everything the runner and the engine slot call on an inference engine, and nothing more.

Only `worker/engine/vllm_engine.py` imports vLLM; everything else talks to this protocol. Adapters: the
in-process vLLM engine (`vllm_engine`), a vLLM server shared with online traffic (`http_engine`, budgeted by
`shared_budget`), and a deterministic fake (`fake`). This package imports nothing else of `worker/`.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass(frozen=True)
class EngineRequest:
    """One queued line, handed to the engine: `request_id` is the batch_requests row id."""

    request_id: str
    url: str  # one of the endpoints a protocol serves (storage/protocols.py `PROTOCOLS`, storage/endpoints.py)
    body: dict[str, Any]
    # Token ids an earlier run generated before the row was handed back (its checkpoint): the engine continues
    # from them when it can do so exactly, else it starts again from the prompt (docs/workers.md).
    resume_token_ids: tuple[int, ...] = ()
    # The LoRA adapter of the engine's model the line named, and its PEFT folder (None with `adapter` set: no
    # longer registered); None: the base model (docs/adapters.md).
    adapter: str | None = None
    adapter_path: str | None = None
    # A checked line drawn again (worker/feed/redraws.py): this seed replaces the body's, nothing else changes.
    seed: int | None = None


@dataclass(frozen=True)
class Progress:
    """What an in-flight request generated so far (a resumed request's earlier tokens included)."""

    token_ids: list[int]
    exact: bool  # resuming from these ids gives what running on would (False: a resume restarts it)


@dataclass
class EngineResult:
    """What became of one request: an OpenAI response body (2xx) or an error body (4xx/5xx)."""

    request_id: str
    status_code: int
    body: dict[str, Any]
    prompt_tokens: int = 0
    completion_tokens: int = 0
    engine_seconds: float = 0.0
    cached_tokens: int = 0  # prompt tokens served from the engine's prefix cache
    reasoning_tokens: int = 0  # of completion_tokens: the thinking before the answer
    error_code: str | None = None
    error_message: str | None = None
    # The generated ids when a resume from them is exact (else empty): if a pause hands the row back before the
    # result is stored, they go back with it as its checkpoint, so the next run decodes only the last token.
    token_ids: list[int] = field(default_factory=list)
    # A checked line's attempts (worker/feed/redraws.py): how many answers were drawn, which check each failed.
    attempts: dict[str, Any] | None = None

    @property
    def ok(self) -> bool:
        return 200 <= self.status_code < 300


@dataclass
class EngineStats:
    """Sequences the engine is decoding now (`running`) and those it has accepted but not started."""

    running: int
    waiting: int
    extra: dict[str, Any] = field(default_factory=dict)


class Engine(Protocol):
    """A continuously fed engine: add requests any time, step it, collect finished results."""

    model_name: str
    max_num_seqs: int

    def add(self, request: EngineRequest) -> EngineResult | None:
        """Submit a request; return an error result at once if its body cannot run (never raise)."""
        ...

    def prepare(self, requests: Collection[EngineRequest]) -> None:
        """Work ahead on requests about to be `add`ed, on another thread (the runner's claimer), so that `add` on
        the engine's thread has less to do; may do nothing. Never raises: `add` reports what is wrong."""
        ...

    def step(self) -> list[EngineResult]:
        """Run one engine iteration and return the requests that finished in it."""
        ...

    def progress(self, request_ids: Collection[str]) -> dict[str, Progress]:
        """Generated token ids so far of these in-flight requests (those the engine can report; others absent).

        Right after `add` of a request with `resume_token_ids`, its progress holds those ids if the engine
        continues from them, and is empty if it restarts the request.
        """
        ...

    def abort(self, request_ids: list[str]) -> None:
        """Drop in-flight requests (cancel, expiry, lost lease); they produce no result."""
        ...

    def cut(self, request_ids: list[str]) -> list[EngineResult]:
        """Stop in-flight requests now (their batch expired) and answer each from what it generated so far, a
        length stop marked as cut (worker/engine/cuts.py); those with nothing to show are dropped unanswered."""
        ...

    def stats(self) -> EngineStats:
        """Running and waiting sequence counts right now."""
        ...

    def has_unfinished(self) -> bool:
        """True while any submitted request has not finished or been aborted."""
        ...

    def dispatch_limit(self) -> int | None:
        """How many requests the runner may keep in flight right now; None: the engine sets no limit.

        A shared-mode engine answers from its dispatch budget (online traffic comes first); engines that own
        their hardware return None and the runner keeps `inflight_per_seq` x max_num_seqs in flight.
        """
        ...

    def waiting_for_inputs(self) -> int:
        """Requests added but not runnable yet, their inputs still being fetched (a line's images): they hold no
        engine slot, so the runner does not count them against its in-flight target (up to as many again)."""
        ...

    def set_urgent(self, urgent: bool) -> None:
        """Whether work inside its deadline's urgency horizon is in flight (a shared engine may lend it room)."""
        ...

    def close(self) -> None:
        """Release the engine's memory and connections now (a model switch unloads it)."""
        ...


def error_result(
    request_id: str, status_code: int, message: str, *, code: str, param: str | None = None
) -> EngineResult:
    """A per-request failure in OpenAI's error-body shape; it becomes one error line."""
    body = {"error": {"message": message, "type": "invalid_request_error", "param": param, "code": code}}
    return EngineResult(
        request_id=request_id,
        status_code=status_code,
        body=body,
        error_code=code,
        error_message=message,
    )
