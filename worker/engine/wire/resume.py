"""Which generations can be resumed exactly from their generated token ids, and which must start again.

Resuming submits the prompt followed by the tokens generated so far as the new prompt. The next token's
distribution is then the same as in the uninterrupted run for greedy and unseeded sampling, but not when
sampling depends on more than the token sequence: penalties computed over *output* tokens (vLLM counts the
resumed tokens as prompt), a seeded generator's position, several choices sharing one request, logprobs
(not stored with a checkpoint) and structured output (the grammar would restart at the resumed tokens).
"""

from __future__ import annotations

from worker.engine.wire.openai import ChatBody, CompletionBody


def restart_reason(run: ChatBody | CompletionBody) -> str | None:
    """Why this body cannot resume exactly (it restarts from its prompt), or None if it can."""
    if run.n > 1:
        return "n > 1"
    if run.presence_penalty or run.frequency_penalty:
        return "presence or frequency penalty"
    if run.seed is not None:
        return "seeded sampling"
    if run.logprob_count() is not None:
        return "logprobs"
    if run.response_format is not None and run.response_format.type != "text":
        return "structured output"
    return None
