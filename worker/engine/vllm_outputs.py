"""What a finished vLLM request becomes: a neutral `Output` (its sequences or vectors and token counts), answered
by the line's wire module.

Works on vLLM's output objects and the tokenizer it is handed; nothing here imports vLLM (only
`worker/engine/vllm_engine.py` does).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from worker.engine import EngineResult, error_result
from worker.engine.cuts import cut_answer
from worker.engine.generation import Generation, Output
from worker.engine.vllm_choices import generated_of
from worker.engine.vllm_parsers import Parsers
from worker.engine.vllm_resume import Resume, stitch, stream_decoder
from worker.engine.wire import Parsed
from worker.engine.wire.base import server_error

logger = logging.getLogger(__name__)


@dataclass
class InFlight:
    """A submitted request: what it runs and how it is answered, and the engine requests it fanned out to."""

    request_id: str
    parsed: Parsed
    started: float
    engine_ids: list[str]
    done: dict[str, Any] = field(default_factory=dict)
    exact: bool = False  # resumable from its generated ids (vllm_resume.exact_params, wire/resume.py)
    resume: Resume | None = None  # continued from a checkpoint: the earlier part, joined in at the end


def result_of(
    flight: InFlight,
    *,
    model_name: str,
    tokenizer: Any,
    tally: Callable[[int, int], None],
    parsers: Parsers | None = None,
    labels: Sequence[str] = (),
) -> EngineResult:
    """The answer to one finished request, from vLLM's outputs (prompt and cached tokens go to `tally`; thinking
    and tool calls taken out of each answer by the model's `parsers`; a classifier's probabilities named by its
    `labels`)."""
    outputs = [flight.done[engine_id] for engine_id in flight.engine_ids]
    problem = next((o.error for o in outputs if getattr(o, "error", None) is not None), None)
    if problem is not None:
        return server_error(flight.request_id, f"the engine failed on this request: {problem.message}")
    generation = flight.parsed.generation
    prompt_tokens = sum(len(o.prompt_token_ids or ()) for o in outputs)
    cached_tokens = sum(getattr(o, "num_cached_tokens", None) or 0 for o in outputs)
    if flight.resume is not None:  # the earlier tokens were prompt to vLLM; to the user they are output
        prompt_tokens = flight.resume.prompt_tokens
        cached_tokens = min(cached_tokens, prompt_tokens)
    tally(prompt_tokens, cached_tokens)
    output = Output(flight.request_id, response_id=uuid.uuid4().hex, prompt_tokens=prompt_tokens)
    output.cached_tokens = cached_tokens
    if generation.kind == "embed":
        output.vectors = [o.outputs.data.float().tolist() for o in outputs]
        return flight.parsed.answer(output, model_name)
    if generation.kind == "classify":
        output.scores = [dict(zip(labels, o.outputs.data.float().tolist(), strict=False)) for o in outputs]
        return flight.parsed.answer(output, model_name)
    completions: list[Any] = sorted(outputs[0].outputs, key=lambda c: c.index)
    if flight.resume is not None:
        completions = [stitch(flight.resume, c) for c in completions]
    if any(c.finish_reason not in ("stop", "length") for c in completions):
        reasons = sorted({str(c.finish_reason) for c in completions})
        return server_error(flight.request_id, f"the engine ended the request early ({', '.join(reasons)})")
    logprobs = generation.sampling.logprobs is not None
    output.sequences = [generated_of(c, tokenizer, logprobs=logprobs) for c in completions]
    if parsers is not None:
        prompt_ids = list(outputs[0].prompt_token_ids or ())
        for completion, sequence in zip(completions, output.sequences, strict=True):
            parsers.finish(generation, sequence, prompt_ids=prompt_ids, token_ids=list(completion.token_ids))
    output.checkpoint = list(completions[0].token_ids) if flight.exact else []  # if a pause beats the record
    return flight.parsed.answer(output, model_name)


# How vLLM's structured-output backends begin the message of a schema they cannot compile (guidance, xgrammar).
_SCHEMA_REFUSALS = (
    "Grammar error: ",
    "Invalid grammar specification: ",
    "Failed to transform json schema into a grammar: ",
    "The provided JSON schema contains features not supported",
)


def invalid_result(rid: str, error: Exception, generation: Generation | None = None) -> EngineResult:
    """vLLM refused the request at submission: a 400 error line (a JSON schema the structured-outputs backend
    cannot compile names the body's field that holds it, with the backend's reason)."""
    message = str(error)
    constraint = generation.constraint if generation is not None else None
    if constraint is not None and message.startswith(_SCHEMA_REFUSALS):
        reason = message.split(": ", 1)[-1].strip()
        message = f"{constraint.param}: the JSON schema cannot be enforced by this server: {reason}"
        return error_result(rid, 400, message, code="invalid_json_schema", param=constraint.param)
    code = "context_length_exceeded" if "context length" in message else "invalid_value"
    return error_result(rid, 400, message, code=code, param=getattr(error, "parameter", None))


def prompt_ids(output_processor: Any, engine_id: str) -> list[int]:
    """The prompt token ids vLLM's output processor holds for this request (empty if it has none)."""
    for internal in output_processor.external_req_ids.get(engine_id, ()):
        state = output_processor.request_states.get(internal)
        if state is not None:
            return list(state.prompt_token_ids or ())
    return []


def cut_result(flight: InFlight, *, model: str, tokenizer: Any, processor: Any) -> EngineResult | None:
    """The answer to a request stopped before its end (its batch expired): the generated ids so far (a resumed
    request's earlier ones first) decoded as vLLM's detokenizer would after its prompt (worker/engine/cuts.py);
    None with nothing to show (an n > 1 request, no token yet, or a failure: the line then ends batch_expired)."""
    if len(flight.engine_ids) != 1:
        return None
    try:
        new_ids = generated_ids(processor, flight.engine_ids[0])
        if flight.resume is not None:
            ids, prompt_tokens, decode = (
                flight.resume.token_ids + new_ids,
                flight.resume.prompt_tokens,
                flight.resume.decode,
            )
        else:
            prompt = prompt_ids(processor, flight.engine_ids[0])
            ids, prompt_tokens, decode = new_ids, len(prompt), stream_decoder(tokenizer, prompt)
        output = Output(flight.request_id, response_id=uuid.uuid4().hex, prompt_tokens=prompt_tokens)
        output.engine_seconds = time.monotonic() - flight.started
        adapter = flight.parsed.generation.adapter
        name = model if adapter is None else adapter.name
        return cut_answer(flight.parsed, output, text=decode(ids) if ids else "", token_count=len(ids), model=name)
    except Exception:
        logger.exception("cutting %s short failed", flight.request_id)
        return None


def generated_ids(output_processor: Any, engine_id: str) -> list[int]:
    """The token ids vLLM's output processor holds for this request so far (its detokenizer keeps them all)."""
    for internal in output_processor.external_req_ids.get(engine_id, ()):
        state = output_processor.request_states.get(internal)
        if state is not None and state.detokenizer is not None:
            return list(state.detokenizer.output_token_ids)
    return []
