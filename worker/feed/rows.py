"""A queue row as the engine's request, and an engine result as the row's outcome: the runner's two translations."""

from __future__ import annotations

from collections.abc import Callable

from storage.json_values import UnstorableValue, storable
from storage.queue.claim import ClaimedRequest
from storage.queue.results import Outcome
from worker.engine import Engine, EngineRequest, EngineResult
from worker.engine.wire.base import server_error
from worker.feed.redraws import next_seed


def engine_request(row: ClaimedRequest) -> EngineRequest:
    """What the engine runs of a leased row (after its checkpoint's tokens, if it has one): a checked line that made
    failed draws before a hand-back goes on with its next draw's seed."""
    return EngineRequest(
        request_id=row.id,
        url=row.url,
        body=row.body,
        resume_token_ids=row.checkpoint,
        adapter=row.adapter,
        adapter_path=row.adapter_path,
        seed=next_seed(row),
    )


def rendering_ahead(engine: Engine) -> Callable[[list[ClaimedRequest]], None]:
    """The claimer thread's hook: the engine renders a claim's rows before the engine thread takes them in."""

    def prepare(rows: list[ClaimedRequest]) -> None:
        engine.prepare([engine_request(row) for row in rows if not row.checkpoint])

    return prepare


def outcome_of(result: EngineResult) -> Outcome:
    """What the database stores of one engine result: its body as the database holds JSON (`storable`); an answer no
    JSON column can hold becomes that line's error (a 500), never a write that fails for the whole flush."""
    try:
        body = storable(result.body)
    except UnstorableValue as error:
        failed = server_error(result.request_id, f"the answer could not be stored as JSON ({error})")
        failed.prompt_tokens, failed.completion_tokens = result.prompt_tokens, result.completion_tokens
        failed.engine_seconds = result.engine_seconds
        return outcome_of(failed)
    return Outcome(
        request_id=result.request_id,
        status_code=result.status_code,
        body=body,
        prompt_tokens=result.prompt_tokens,
        completion_tokens=result.completion_tokens,
        engine_seconds=result.engine_seconds,
        error_code=result.error_code,
        error_message=result.error_message,
        cached_tokens=result.cached_tokens,
        reasoning_tokens=result.reasoning_tokens,
        check_attempts=result.attempts,
    )
