"""The roofline planner: what one decode step costs at each batch size, from bytes and bandwidth.

A decode step is memory-bound: it reads every weight byte once, plus the KV cache of every running
sequence. So with batch size B on a node of G GPUs:

    step_time  = (weight_bytes + B x kv_bytes_per_token x context) / (G x HBM bandwidth)   (= TPOT)
    throughput = B / step_time                                                      (node tokens/s)
    $ per 1M   = node $/s / throughput x 1e6
    memory     = weight_bytes + B x kv_bytes_per_token x context          (must fit in G x HBM)

The step time is step_time.py's formula with no prefill (the larger of that memory time and the compute
time, which a decode batch never reaches below the memory limit). The plan adds the other clock:
prefill, compute-bound (prompt tokens/s), and a job's steady state with both clocks and its bill. These are
ceilings: attention kernels, sampling and the interconnect are ignored, so a real stack lands under them.
The shape transfers; the absolute numbers are a best case. GB means 1e9 bytes.
Physics (seconds, bytes, tokens/s) is float; money is Decimal, never rounded until it is displayed.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal
from typing import Any

from storage.planning import step_time
from storage.planning.node import (
    BOUNDS,
    EXAMPLE_CONTEXT,
    EXAMPLE_HARDWARE,
    GB,
    HARDWARE_PRESETS,
    KV_DTYPE_BYTES,
    LLAMA_70B_FP8,
    WEIGHT_DTYPE_BYTES,
    Bound,
    Hardware,
    ModelShape,
)

__all__ = [
    "BOUNDS",
    "EXAMPLE_CONTEXT",
    "EXAMPLE_HARDWARE",
    "GB",
    "HARDWARE_PRESETS",
    "KV_DTYPE_BYTES",
    "LLAMA_70B_FP8",
    "WEIGHT_DTYPE_BYTES",
    "Bound",
    "Hardware",
    "Job",
    "ModelShape",
    "Plan",
    "PlanRow",
    "plan",
]

_SECONDS_PER_HOUR = Decimal(3600)
_MILLION = Decimal(1_000_000)
VLLM_MAX_NUM_SEQS = 1024  # vLLM's default max_num_seqs on H100/H200-class GPUs: the job estimate's cap


@dataclass(frozen=True)
class PlanRow:
    """The roofline at one batch size."""

    batch_size: int
    tpot_ms: float
    user_tokens_per_s: float
    node_tokens_per_s: float
    usd_per_mtok: Decimal
    memory_gb: float
    fits: bool


@dataclass(frozen=True)
class Plan:
    """Rows for the requested batch sizes, where batching stops paying, and the memory limit."""

    model: ModelShape
    hardware: Hardware
    context: int
    rows: tuple[PlanRow, ...]
    knee_batch_size: int
    max_batch_size: int
    job: step_time.JobEstimate | None = None

    @property
    def prefill_tokens_per_s(self) -> float:
        """Prompt tokens per second when the node only prefills (compute-bound)."""
        return step_time.prefill_tokens_per_s(self.model, self.hardware)

    @property
    def usd_per_mtok_prefill(self) -> Decimal:
        """Node $/s over that prefill rate, per million prompt tokens."""
        rate = Decimal(repr(self.prefill_tokens_per_s))
        return self.hardware.usd_per_hour * _MILLION / (_SECONDS_PER_HOUR * rate)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready view: money as Decimal strings rounded here, once, to 6 places."""
        hw = self.hardware
        return {
            "model": {"weight_bytes": self.model.weight_bytes, "kv_bytes_per_token": self.model.kv_bytes_per_token},
            "hardware": {
                "gpus": hw.gpus,
                "hbm_bytes_per_gpu": hw.hbm_bytes_per_gpu,
                "hbm_bandwidth_bytes_per_s_per_gpu": hw.hbm_bandwidth_bytes_per_s_per_gpu,
                "usd_per_gpu_hour": str(hw.usd_per_gpu_hour),
                "usd_per_hour": str(hw.usd_per_hour),
            },
            "context": self.context,
            "rows": [
                {
                    "batch_size": r.batch_size,
                    "tpot_ms": round(r.tpot_ms, 4),
                    "user_tokens_per_s": round(r.user_tokens_per_s, 2),
                    "node_tokens_per_s": round(r.node_tokens_per_s, 2),
                    "usd_per_mtok": _usd(r.usd_per_mtok),
                    "memory_gb": round(r.memory_gb, 3),
                    "fits": r.fits,
                }
                for r in self.rows
            ],
            "knee_batch_size": self.knee_batch_size,
            "max_batch_size": self.max_batch_size,
            "prefill": {
                "parameters": self.model.parameter_count,
                "flops_per_s": self.hardware.flops_per_s(self.model.weight_dtype),
                "compute_efficiency": self.hardware.compute_efficiency,
                "prompt_tokens_per_s": round(self.prefill_tokens_per_s, 1),
                "usd_per_mtok_prompt": _usd(self.usd_per_mtok_prefill),
            },
            "job": None if self.job is None else job_dict(self.job),
        }


def _usd(value: Decimal) -> str:
    return str(value.quantize(Decimal("0.000001"), ROUND_HALF_UP))


def job_dict(job: step_time.JobEstimate) -> dict[str, Any]:
    """A JSON-ready view of a job estimate (seconds as float, money as a Decimal string)."""
    return {
        "requests": job.requests,
        "prompt_tokens": job.prompt_tokens,
        "output_tokens": job.output_tokens,
        "max_num_seqs": job.max_num_seqs,
        "max_num_batched_tokens": job.max_num_batched_tokens,
        "limited_by": job.limited_by,
        "bound": job.bound,
        "decode_seqs_per_step": round(job.load.decode_seqs, 2),
        "prefill_tokens_per_step": round(job.load.prefill_tokens, 1),
        "tpot_ms": round(job.step_seconds * 1e3, 4),
        "ttft_ms": round(job.ttft_seconds * 1e3, 4),
        "requests_per_s": round(job.requests_per_s, 2),
        "prompt_tokens_per_s": round(job.prompt_tokens_per_s, 1),
        "output_tokens_per_s": round(job.output_tokens_per_s, 1),
        "seconds": round(job.seconds, 3),
        "usd": _usd(job.usd),
        "usd_per_mtok": _usd(job.usd_per_mtok),
    }


def _check_context(context: int) -> None:
    if context < 1:
        raise ValueError(f"context must be a positive number of tokens, got {context}")


def memory_bytes(model: ModelShape, context: int, batch_size: int) -> float:
    """Weights plus the KV cache of `batch_size` sequences of `context` tokens."""
    return model.weight_bytes + batch_size * model.kv_bytes_per_sequence(context)


def step_seconds(model: ModelShape, hardware: Hardware, context: int, batch_size: int) -> float:
    """One decode step (TPOT) of `batch_size` sequences: step_time's formula with no prefill."""
    return step_time.step_seconds(model, hardware, context, step_time.StepLoad(decode_seqs=batch_size))


def usd_per_mtok(model: ModelShape, hardware: Hardware, context: int, batch_size: int) -> Decimal:
    """Node $/s over node tokens/s, per million tokens, in exact Decimal from the inputs."""
    step = step_time.step_seconds_exact(model, hardware, context, step_time.StepLoad(decode_seqs=batch_size))
    return hardware.usd_per_hour * step * _MILLION / (_SECONDS_PER_HOUR * batch_size)


def row(model: ModelShape, hardware: Hardware, context: int, batch_size: int) -> PlanRow:
    """The roofline at one batch size."""
    if batch_size < 1:
        raise ValueError(f"batch sizes must be positive, got {batch_size}")
    step = step_seconds(model, hardware, context, batch_size)
    used = memory_bytes(model, context, batch_size)
    return PlanRow(
        batch_size=batch_size,
        tpot_ms=step * 1e3,
        user_tokens_per_s=1 / step,
        node_tokens_per_s=batch_size / step,
        usd_per_mtok=usd_per_mtok(model, hardware, context, batch_size),
        memory_gb=used / GB,
        fits=used <= hardware.hbm_bytes,
    )


def knee_batch_size(model: ModelShape, context: int) -> int:
    """The batch whose KV reads equal the weight reads: past it, batching buys little throughput."""
    _check_context(context)
    return max(1, round(model.weight_bytes / model.kv_bytes_per_sequence(context)))


def max_batch_size(model: ModelShape, hardware: Hardware, context: int, *, memory_fraction: float = 1.0) -> int:
    """The largest batch whose weights and KV cache fit in `memory_fraction` of the node's HBM (0 if none)."""
    _check_context(context)
    if not 0 < memory_fraction <= 1:
        raise ValueError(f"memory fraction must be in (0, 1], got {memory_fraction}")
    budget = hardware.hbm_bytes * memory_fraction
    spare = (budget - model.weight_bytes) / model.kv_bytes_per_sequence(context)
    if not math.isfinite(spare):
        raise ValueError("the node's memory over one sequence's KV cache is not a finite number")
    batch = max(0, math.floor(spare))
    # Float division can land one off at an exact boundary; settle it with the same test `fits` uses, a
    # bounded number of steps (closed form: a huge batch must never turn this into a +1 loop).
    for _ in range(4):
        if memory_bytes(model, context, batch + 1) <= budget:
            batch += 1
        elif batch > 0 and memory_bytes(model, context, batch) > budget:
            batch -= 1
        else:
            break
    return batch


def max_num_seqs_for(
    model: ModelShape,
    hardware: Hardware,
    context: int,
    *,
    memory_fraction: float = 1.0,
    cap: int | None = None,
) -> int:
    """The engine's running-batch size: the largest batch that fits, optionally capped, at least 1."""
    batch = max_batch_size(model, hardware, context, memory_fraction=memory_fraction)
    if cap is not None:
        batch = min(batch, cap)
    return max(1, batch)


def default_batch_sizes(model: ModelShape, hardware: Hardware, context: int) -> list[int]:
    """Powers of two up to the memory limit, plus the knee and the limit itself."""
    limit = max_batch_size(model, hardware, context)
    sizes = {1 << k for k in range(max(limit, 1).bit_length())}
    sizes |= {knee_batch_size(model, context), max(limit, 1)}
    return sorted(sizes)


@dataclass(frozen=True)
class Job:
    """A job to cost beside the table: identical requests of `prompt_tokens` in, `output_tokens` out."""

    requests: int
    prompt_tokens: int
    output_tokens: int
    max_num_seqs: int | None = None  # default: the largest batch that fits at the job's own length
    max_num_batched_tokens: int = step_time.DEFAULT_MAX_NUM_BATCHED_TOKENS


def estimate(model: ModelShape, hardware: Hardware, job: Job) -> step_time.JobEstimate:
    """The job on a perfectly fed engine whose sequences hold prompt + output tokens of KV cache each."""
    length = job.prompt_tokens + job.output_tokens
    seqs = job.max_num_seqs or max_num_seqs_for(model, hardware, length, cap=VLLM_MAX_NUM_SEQS)
    return step_time.estimate_job(
        model,
        hardware,
        length,
        requests=job.requests,
        prompt_tokens=job.prompt_tokens,
        output_tokens=job.output_tokens,
        max_num_seqs=seqs,
        max_num_batched_tokens=job.max_num_batched_tokens,
    )


def plan(
    model: ModelShape,
    hardware: Hardware,
    context: int,
    batch_sizes: Iterable[int] | None = None,
    *,
    job: Job | None = None,
) -> Plan:
    """Roofline rows for each batch size (default: powers of two, the knee and the memory limit), the
    prefill rate, and `job`'s estimate when given."""
    _check_context(context)
    sizes = list(batch_sizes) if batch_sizes is not None else default_batch_sizes(model, hardware, context)
    if not sizes:
        raise ValueError("give at least one batch size")
    return Plan(
        model=model,
        hardware=hardware,
        context=context,
        rows=tuple(row(model, hardware, context, b) for b in sizes),
        knee_batch_size=knee_batch_size(model, context),
        max_batch_size=max_batch_size(model, hardware, context),
        job=None if job is None else estimate(model, hardware, job),
    )
