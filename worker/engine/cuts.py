"""Answers cut short: what a request generated so far, answered as a length stop (docs/workflow.md, "Partial
answers at expiry").

When a batch's completion window closes on a request still generating, the runner asks its engine to `cut` it:
the engine stops the sequence and answers it from the tokens it has, through the line's own wire module, so
the answer reads like one that reached its token limit in the line's own protocol (`finish_reason: "length"`,
Responses `incomplete` with `max_output_tokens`; each wire module's own words), with its usage, and carries
`"backfill": {"cut_by": "expiry"}`.
"""

from __future__ import annotations

from worker.engine import EngineResult
from worker.engine.generation import Generated, Generation, Output
from worker.engine.wire import Parsed

EXPIRY = "expiry"


def cuttable(generation: Generation) -> bool:
    """Whether a partial answer of this generation can be shown: one text choice that is not a forced tool call
    (half a call's arguments is no call; an embedding or a classification has nothing partial)."""
    return not generation.pooling and generation.sampling.n == 1 and not generation.tool_choice.forced


def cut_answer(
    parsed: Parsed,
    output: Output,
    *,
    text: str,
    token_count: int,
    model: str,
    reason: str = EXPIRY,
    reasoning: str | None = None,
    reasoning_tokens: int = 0,
) -> EngineResult | None:
    """The line's answer from `token_count` generated tokens decoded as `text` (and any thinking split off), cut
    by `reason`; None when there is nothing to show (no token yet, or a generation `cuttable` refuses)."""
    if token_count < 1 or not cuttable(parsed.generation):
        return None
    sequence = Generated(text=text, token_count=token_count, finish_reason="length")
    sequence.reasoning, sequence.reasoning_tokens = reasoning, reasoning_tokens
    output.sequences, output.cut_by, output.checkpoint = [sequence], reason, []
    return parsed.answer(output, model)
