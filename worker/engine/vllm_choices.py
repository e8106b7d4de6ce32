"""vLLM's completion outputs as neutral generated sequences: text, why it stopped, and each token's logprobs.

Token texts come from vLLM's `decoded_token` when it has one, else from the model's tokenizer. The protocol's
wire module shapes them into its answer (worker/engine/wire/).
"""

from __future__ import annotations

from typing import Any

from worker.engine.generation import Generated, TokenLogprob

# Logprobs can be -inf, which JSON cannot carry; vLLM's server clamps the same way.
_MIN_LOGPROB = -9999.0


def generated_of(completion: Any, tokenizer: Any, *, logprobs: bool) -> Generated:
    """One vLLM completion output as a `Generated` sequence, with its logprobs if they were asked for."""
    tokens = None
    if logprobs and completion.logprobs is not None:
        tokens = [
            _token_logprob(token_id, position, tokenizer)
            for token_id, position in zip(completion.token_ids, completion.logprobs, strict=False)
        ]
    return Generated(
        text=completion.text,
        token_count=len(completion.token_ids),
        finish_reason=str(completion.finish_reason),
        matched=completion.stop_reason,
        logprobs=tokens,
    )


def _token_text(token_id: int, logprob: Any, tokenizer: Any) -> str:
    text = getattr(logprob, "decoded_token", None)
    return text if text is not None else str(tokenizer.decode([token_id]))


def _token_logprob(token_id: int, position: dict[int, Any], tokenizer: Any) -> TokenLogprob:
    """The chosen token and every alternative vLLM returned at this position, best first."""
    chosen = position[token_id]
    ranked = sorted(position.items(), key=lambda item: -item[1].logprob)
    return TokenLogprob(
        token=_token_text(token_id, chosen, tokenizer),
        logprob=max(chosen.logprob, _MIN_LOGPROB),
        top=[(_token_text(tid, lp, tokenizer), max(lp.logprob, _MIN_LOGPROB)) for tid, lp in ranked],
    )
