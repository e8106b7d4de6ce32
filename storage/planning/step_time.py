"""How long one engine step lasts, decode and prefill together: the formula the planner and the GPU-timed
engine share (the seed's two clocks: TTFT is prefill, compute-bound; TPOT is decode, memory-bound).

A step decodes B sequences (one token each) and prefills P prompt tokens (chunks of prompts mixed with the
decodes, at most `max_num_batched_tokens` tokens in all, as vLLM's chunked prefill and Sarathi-Serve do).
It reads every weight once and the KV cache it attends to, and multiplies every token through every weight:

    memory  = (weights + B x KV per sequence(context) + KV per token x (P + C)) / node HBM bandwidth
    compute = 2 x parameters x (B + P) / (node dense FLOP/s x efficiency)
    step    = max(memory, compute)

C is the prompt tokens of earlier chunks that this step's chunks attend to (read from the KV cache); the
P x KV term is the cache the chunk writes. Both are bytes the step moves, and neither moves a figure by
1% where memory binds. With P = 0 the compute term stays under the memory term up to the memory limit
(6.8 ms against 21.9 ms at batch 384 for 70B FP8 on 8x H100), so the decode table of
shared/inference-economics.txt is unchanged. Left out: attention FLOPs (2 x layers x hidden x prompt per
prompt token, 0.5% of the matmuls at 500-token prompts and 2% at 2,000 for 70B), sampling, the
interconnect: these are ceilings.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal

from storage.planning.node import Hardware, ModelShape

# vLLM's offline default on H100/H200-class GPUs (EngineArgs: 16,384 for the LLM class when a GPU has
# >= 70 GiB; 8,192 for the API server): the most tokens one step may carry.
DEFAULT_MAX_NUM_BATCHED_TOKENS = 16384
_SECONDS_PER_HOUR = Decimal(3600)
_MILLION = Decimal(1_000_000)


@dataclass(frozen=True)
class StepLoad:
    """What one step carries: sequences decoding, prompt tokens prefilled, earlier-chunk tokens attended."""

    decode_seqs: float = 0
    prefill_tokens: float = 0
    prefill_context_tokens: float = 0

    @property
    def tokens(self) -> float:
        """Tokens through the weights: one per decoding sequence plus every prefilled prompt token."""
        return self.decode_seqs + self.prefill_tokens


def bytes_moved(model: ModelShape, context: int, load: StepLoad) -> float:
    """Weights, the decoders' KV cache at `context` tokens each, and the prefill chunks' KV written and read."""
    kv = model.kv_bytes_per_token
    return (
        model.weight_bytes + load.decode_seqs * kv * context + kv * (load.prefill_tokens + load.prefill_context_tokens)
    )


def flops(model: ModelShape, load: StepLoad) -> float:
    """2 FLOPs per parameter per token (a multiply and an add), for every token the step carries."""
    return 2 * model.parameter_count * load.tokens


def memory_seconds(model: ModelShape, hardware: Hardware, context: int, load: StepLoad) -> float:
    """The step's bytes over the node's aggregate HBM bandwidth."""
    return bytes_moved(model, context, load) / hardware.bandwidth_bytes_per_s


def compute_seconds(model: ModelShape, hardware: Hardware, load: StepLoad) -> float:
    """The step's FLOPs over the node's usable FLOP/s (dense rate x GPUs x efficiency)."""
    return flops(model, load) / hardware.flops_per_s(model.weight_dtype)


def step_seconds(model: ModelShape, hardware: Hardware, context: int, load: StepLoad) -> float:
    """One step: whichever of memory and compute takes longer."""
    return max(memory_seconds(model, hardware, context, load), compute_seconds(model, hardware, load))


def step_seconds_exact(model: ModelShape, hardware: Hardware, context: int, load: StepLoad) -> Decimal:
    """`step_seconds` in Decimal from the inputs' own digits, for money (never rounded until displayed)."""
    memory = Decimal(repr(bytes_moved(model, context, load))) / Decimal(repr(hardware.bandwidth_bytes_per_s))
    compute = Decimal(repr(flops(model, load))) / Decimal(repr(hardware.flops_per_s(model.weight_dtype)))
    return max(memory, compute)


def bound(model: ModelShape, hardware: Hardware, context: int, load: StepLoad) -> str:
    """ "memory" or "compute": the term that sets the step's length."""
    memory = memory_seconds(model, hardware, context, load)
    return "memory" if memory >= compute_seconds(model, hardware, load) else "compute"


def prefill_tokens_per_s(model: ModelShape, hardware: Hardware) -> float:
    """The node's prompt tokens per second when prefill is compute-bound (the seed's ~56,000 for 70B FP8)."""
    return hardware.flops_per_s(model.weight_dtype) / (2 * model.parameter_count)


def ttft_alone_seconds(
    model: ModelShape,
    hardware: Hardware,
    context: int,
    prompt_tokens: int,
    max_num_batched_tokens: int = DEFAULT_MAX_NUM_BATCHED_TOKENS,
) -> float:
    """Time to first token of one prompt on an idle node: its chunks, one step each (queueing excluded)."""
    if prompt_tokens < 1 or max_num_batched_tokens < 1:
        raise ValueError("prompt tokens and max_num_batched_tokens must be positive")
    total, done = 0.0, 0
    while done < prompt_tokens:
        chunk = min(max_num_batched_tokens, prompt_tokens - done)
        total += step_seconds(model, hardware, context, StepLoad(prefill_tokens=chunk, prefill_context_tokens=done))
        done += chunk
    return total


@dataclass(frozen=True)
class JobEstimate:
    """A job of identical requests on a perfectly fed engine, in its steady state (both clocks and the bill)."""

    requests: int
    prompt_tokens: int
    output_tokens: int
    max_num_seqs: int
    max_num_batched_tokens: int
    load: StepLoad  # one steady-state step
    requests_per_step: float
    limited_by: str  # "token budget" or "slots"
    bound: str  # "compute" or "memory"
    step_seconds: float  # = TPOT of every decoding sequence
    prefill_steps: float  # steps a prompt's prefill spans (its last chunk also yields the first token)
    seconds: float
    usd: Decimal

    @property
    def ttft_seconds(self) -> float:
        """From a request's first prefill chunk to its first token, inside the full batch (queueing excluded)."""
        return max(1.0, self.prefill_steps) * self.step_seconds

    @property
    def requests_per_s(self) -> float:
        """Requests finished per second in the steady state."""
        return self.requests_per_step / self.step_seconds

    @property
    def prompt_tokens_per_s(self) -> float:
        """Prompt tokens prefilled per second."""
        return self.requests_per_s * self.prompt_tokens

    @property
    def output_tokens_per_s(self) -> float:
        """Output tokens per second."""
        return self.requests_per_s * self.output_tokens

    @property
    def usd_per_mtok(self) -> Decimal:
        """The job's cost per million tokens it processed (prompt and output together)."""
        return self.usd * _MILLION / (self.requests * (self.prompt_tokens + self.output_tokens))


def _steady_load(p: int, q: int, rate: float, budget: int) -> tuple[StepLoad, float]:
    """The step of a steady state admitting `rate` requests per step; and the steps a prefill spans."""
    decode = rate * q
    prefill_steps = max(1.0, p / (budget - decode))
    context = rate * p * (prefill_steps - 1) / 2  # chunk i of n attends to i/n of its prompt
    return StepLoad(decode_seqs=decode, prefill_tokens=rate * p, prefill_context_tokens=context), prefill_steps


def estimate_job(
    model: ModelShape,
    hardware: Hardware,
    context: int,
    *,
    requests: int,
    prompt_tokens: int,
    output_tokens: int,
    max_num_seqs: int,
    max_num_batched_tokens: int = DEFAULT_MAX_NUM_BATCHED_TOKENS,
) -> JobEstimate:
    """The fastest steady state a full engine reaches on `requests` identical requests, and what it costs.

    Each request prefills `prompt_tokens` (the step of its last chunk yields its first token) and then
    decodes the other `output_tokens - 1`, one per step. Admitting r requests per step puts r x (prompt +
    output - 1) tokens in a step (at most `max_num_batched_tokens`) and holds r x (prefill steps + output
    - 1) sequences (at most `max_num_seqs`); requests per second rise with r, so the largest r both allow
    wins. The job lasts its admissions at that step time plus the drain of the last requests admitted.
    """
    if min(requests, prompt_tokens, output_tokens, max_num_seqs, max_num_batched_tokens) < 1:
        raise ValueError("requests, prompt and output tokens, max_num_seqs, max_num_batched_tokens must be positive")
    p, q = prompt_tokens, output_tokens - 1
    rate, limited_by = max_num_batched_tokens / (p + q), "token budget"

    def slots(r: float) -> float:
        return r * (q + _steady_load(p, q, r, max_num_batched_tokens)[1])

    if slots(rate) > max_num_seqs:
        low, high, limited_by = 0.0, rate, "slots"
        for _ in range(60):  # slots(r) rises with r: bisect to where the engine's slots are all held
            mid = (low + high) / 2
            low, high = (mid, high) if slots(mid) <= max_num_seqs else (low, mid)
        rate = low
    load, prefill_steps = _steady_load(p, q, rate, max_num_batched_tokens)
    step = step_seconds(model, hardware, context, load)
    # After the last admission the batch drains: its last prompts' chunks, then decode-only steps whose
    # batch falls from the steady state's to nothing (half of it on average).
    drain = StepLoad(decode_seqs=load.decode_seqs / 2)
    drain_steps = Decimal(repr(max(0.0, prefill_steps - 1) + q))
    full_steps = Decimal(repr(requests / rate))
    exact = step_seconds_exact(model, hardware, context, load) * full_steps
    exact += step_seconds_exact(model, hardware, context, drain) * drain_steps if q else Decimal(0)
    seconds = float(full_steps) * step + (
        float(drain_steps) * step_seconds(model, hardware, context, drain) if q else 0.0
    )
    usd = hardware.usd_per_hour * exact
    return JobEstimate(
        requests=requests,
        prompt_tokens=prompt_tokens,
        output_tokens=output_tokens,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        load=load,
        requests_per_step=rate,
        limited_by=limited_by,
        bound=bound(model, hardware, context, load),
        step_seconds=step,
        prefill_steps=prefill_steps,
        seconds=seconds,
        usd=usd / _SECONDS_PER_HOUR,
    )
