"""Prefill pacing for shared mode: how many batch prompt tokens may reach the server per engine step.

The dispatch budget (worker/engine/shared_budget.py) decides how many batch requests may be on the server; on
a GPU that is not what online users pay for. A decode step is memory-bound (the weights are read once, however
many sequences decode), so a few more decoding sequences cost little; a prompt is compute-bound, and every batch
prompt token the scheduler puts into a step lengthens it (Llama 3.1 70B FP8 on 8x H100: a 2.7 ms decode step
becomes 8.9 ms with one 500-token prompt in it). The online users feel it twice: their next token waits for the
long step (TPOT), and an online prompt that shares the step with a batch chunk, or arrives during it, gets its
first token later (TTFT). What matters is therefore how many batch prompt tokens the server has to prefill per
step, and that is what this pacer bounds:

    rate        = batch_prefill_tokens_per_step / step_seconds      prompt tokens per second
    bucket      += rate * elapsed   (at most rate * BURST_SECONDS: no two prompts at once after a quiet spell)
    send        while bucket >= 0, then bucket -= the request's prompt tokens (estimated)

`step_seconds` is the server's own mean inter-token latency over the last metrics poll (its
`vllm:inter_token_latency_seconds` sum and count), so the pace follows the hardware and slows down by itself
when steps lengthen. Until a step time is known (or on a server without those counters), one batch request is
on the server at a time.

A request's prompt tokens are estimated before it is sent from the size of its body, at a tokens-per-character
ratio learnt from the server's own answers (`usage.prompt_tokens`; it starts at OpenAI's rule of thumb of four
characters a token). A wrong estimate only shifts the pace until the first answers come back.

The pacer bounds the average; the server decides how a prompt is cut into steps. Without
`--long-prefill-token-threshold` vLLM prefills a prompt in one step (up to `max_num_batched_tokens`), so one
500-token batch prompt is still one long step, however rarely it comes. docs/shared-mode.md gives the figures.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# What the bucket may save: the runner checks it every 50 ms at most, so a send is at most that late, and a
# burst of one prompt is never followed at once by a second (two prompts in one step make one long step).
BURST_SECONDS = 0.05
CHARS_PER_TOKEN = 4.0  # OpenAI's rule of thumb, until the server's answers say better
LEARN_WEIGHT = 0.1  # weight of each answer in the learnt tokens-per-character ratio


@dataclass
class PrefillPacer:
    """A token bucket of batch prompt tokens, refilled at `tokens_per_step` per server step."""

    tokens_per_step: float
    burst_seconds: float = BURST_SECONDS
    burst_tokens: float | None = None  # set: what the bucket may save, in tokens (staged pieces: half a piece)
    tokens_per_char: float = 1 / CHARS_PER_TOKEN
    step_seconds: float | None = None  # the server's mean step (inter-token latency); None: not seen yet
    bucket: float = 0.0
    _at: float | None = field(default=None, repr=False)

    @property
    def tokens_per_s(self) -> float | None:
        """The pace in prompt tokens per second (None until the server's step time is known)."""
        return None if self.step_seconds is None else self.tokens_per_step / self.step_seconds

    def observe_step(self, step_seconds: float) -> None:
        """The server's mean step over the last poll (from its inter-token latency)."""
        if step_seconds > 0:
            self.step_seconds = step_seconds

    def estimate(self, chars: int) -> int:
        """Prompt tokens of a request whose body has `chars` characters (at least 1)."""
        return max(1, round(chars * self.tokens_per_char))

    def learn(self, chars: int, prompt_tokens: int) -> None:
        """An answer's `usage.prompt_tokens` for a body of `chars` characters: move the ratio towards it."""
        if chars > 0 and prompt_tokens > 0:
            self.tokens_per_char += LEARN_WEIGHT * (prompt_tokens / chars - self.tokens_per_char)

    def allows(self, now: float, *, busy: bool) -> bool:
        """Whether a batch prompt may go out now (`busy`: some of ours are on the server already)."""
        if self.tokens_per_s is None:
            return not busy
        self._refill(now)
        return self.bucket >= 0

    def spend(self, tokens: int, now: float) -> None:
        """A batch prompt of `tokens` went out (the bucket may go into debt: the next one waits longer)."""
        if self.tokens_per_s is not None:
            self._refill(now)
            self.bucket -= tokens

    def _refill(self, now: float) -> None:
        rate = self.tokens_per_s
        if self._at is not None and rate is not None:
            cap = rate * self.burst_seconds if self.burst_tokens is None else self.burst_tokens
            self.bucket = min(self.bucket + rate * (now - self._at), cap)
        self._at = now
