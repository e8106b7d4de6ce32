"""The roofline planner: what one decode step costs at each batch size, from bytes and bandwidth.

A decode step is memory-bound: it reads every weight byte once, plus the KV cache of every running
sequence. So with batch size B on a node of G GPUs:

    step_time  = (weight_bytes + B x kv_bytes_per_token x context) / (G x HBM bandwidth)   (= TPOT)
    throughput = B / step_time                                                      (node tokens/s)
    $ per 1M   = node $/s / throughput x 1e6
    memory     = weight_bytes + B x kv_bytes_per_token x context          (must fit in G x HBM)

These are ceilings: attention kernels, sampling, prefill and the interconnect are ignored, so a real
stack lands under them. The shape transfers; the absolute numbers are a best case. GB means 1e9 bytes.
Physics (seconds, bytes, tokens/s) is float; money is Decimal, never rounded until it is displayed.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal
from typing import Any

GB = 1e9
_SECONDS_PER_HOUR = Decimal(3600)
_MILLION = Decimal(1_000_000)


@dataclass(frozen=True)
class Bound:
    """The accepted range of one planner input (the API's `ge`/`le` and the CLI's check use the same)."""

    low: float
    high: float

    def check(self, name: str, value: float | Decimal) -> None:
        """ValueError naming the input unless low <= value <= high (and finite)."""
        if not self.low <= value <= self.high:
            raise ValueError(f"{name} must be between {self.low:g} and {self.high:g}, got {value}")


# Generous for any real node (a 4,096-GPU pod, 100 TB of weights, a 10M-token context) and small enough that
# every figure the planner derives stays a finite float well inside 2**53.
BOUNDS = {
    "weights_gb": Bound(0.001, 100_000),
    "kv_bytes_per_token": Bound(1, 1e9),
    "gpus": Bound(1, 4096),
    "hbm_gb": Bound(0.001, 100_000),
    "hbm_tbps": Bound(0.001, 1000),
    "gpu_hour_usd": Bound(0.0001, 10_000),
    "context": Bound(1, 10_000_000),
    "batch_size": Bound(1, 10_000_000),
}

WEIGHT_DTYPE_BYTES: dict[str, float] = {"fp32": 4.0, "bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "int4": 0.5}
KV_DTYPE_BYTES: dict[str, float] = {"fp32": 4.0, "bf16": 2.0, "fp16": 2.0, "fp8": 1.0}
# config.json "torch_dtype" -> our dtype names; vLLM's kv_cache_dtype "auto" follows the model dtype.
_TORCH_DTYPES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}
# Families whose MLP is a plain up/down projection; everything else is assumed gated (SwiGLU: 3 mats).
_UNGATED_MODEL_TYPES = frozenset({"gpt2", "gpt_neox", "gptj", "opt", "bloom", "falcon", "phi", "bert"})


@dataclass(frozen=True)
class ModelShape:
    """What a decode step must read: the weights, and the KV cache per token of context."""

    weight_bytes: float
    kv_bytes_per_token: float

    def __post_init__(self) -> None:
        if not self.weight_bytes > 0:
            raise ValueError(f"weight bytes must be positive, got {self.weight_bytes}")
        if not self.kv_bytes_per_token > 0:
            raise ValueError(f"KV bytes per token must be positive, got {self.kv_bytes_per_token}")

    def kv_bytes_per_sequence(self, context: int) -> float:
        """KV cache bytes held by one sequence of `context` tokens."""
        return self.kv_bytes_per_token * context

    @classmethod
    def from_hf_config(
        cls, config: Mapping[str, Any], *, weight_dtype: str | None = None, kv_dtype: str | None = None
    ) -> ModelShape:
        """Estimate weights and KV per token from a HuggingFace config.json (dtypes default to its own)."""
        native = _TORCH_DTYPES.get(str(config.get("torch_dtype", "bfloat16")), "bf16")
        weight_dtype = weight_dtype or native
        kv_dtype = kv_dtype or native
        if weight_dtype not in WEIGHT_DTYPE_BYTES:
            raise ValueError(f"unknown weight dtype {weight_dtype!r}: use one of {', '.join(WEIGHT_DTYPE_BYTES)}")
        if kv_dtype not in KV_DTYPE_BYTES:
            raise ValueError(f"unknown KV dtype {kv_dtype!r}: use one of {', '.join(KV_DTYPE_BYTES)}")
        dims = _Dims.from_config(config)
        return cls(
            weight_bytes=dims.parameter_count() * WEIGHT_DTYPE_BYTES[weight_dtype],
            kv_bytes_per_token=2 * dims.layers * dims.kv_heads * dims.head_dim * KV_DTYPE_BYTES[kv_dtype],
        )


def _first(config: Mapping[str, Any], *keys: str) -> Any:
    """The first of `keys` present in the config (families spell the same dimension differently)."""
    for key in keys:
        if config.get(key) is not None:
            return config[key]
    return None


@dataclass(frozen=True)
class _Dims:
    hidden: int
    layers: int
    intermediate: int
    vocab: int
    heads: int
    kv_heads: int
    head_dim: int
    experts: int
    gated: bool
    tied: bool

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> _Dims:
        hidden = _first(config, "hidden_size", "n_embd", "d_model")
        layers = _first(config, "num_hidden_layers", "n_layer", "num_layers")
        heads = _first(config, "num_attention_heads", "n_head")
        vocab = _first(config, "vocab_size")
        missing = [n for n, v in (("hidden_size", hidden), ("num_hidden_layers", layers)) if v is None]
        missing += [n for n, v in (("num_attention_heads", heads), ("vocab_size", vocab)) if v is None]
        if missing:
            raise ValueError(f"config.json lacks {', '.join(missing)}")
        head_dim = _first(config, "head_dim") or hidden // heads
        return cls(
            hidden=int(hidden),
            layers=int(layers),
            intermediate=int(_first(config, "intermediate_size", "n_inner", "ffn_dim") or 4 * hidden),
            vocab=int(vocab),
            heads=int(heads),
            kv_heads=int(_first(config, "num_key_value_heads", "num_kv_heads") or heads),
            head_dim=int(head_dim),
            experts=int(_first(config, "num_local_experts") or 1),
            gated=str(config.get("model_type", "")) not in _UNGATED_MODEL_TYPES,
            tied=bool(config.get("tie_word_embeddings", False)),
        )

    def parameter_count(self) -> int:
        """Projections, MLP (per expert), norms and embeddings; biases are too small to matter."""
        attention = self.hidden * self.head_dim * (2 * self.heads + 2 * self.kv_heads)
        mlp = (3 if self.gated else 2) * self.hidden * self.intermediate * self.experts
        router = self.hidden * self.experts if self.experts > 1 else 0
        per_layer = attention + mlp + router + 2 * self.hidden
        embeddings = self.vocab * self.hidden * (1 if self.tied else 2)
        return self.layers * per_layer + embeddings + self.hidden


@dataclass(frozen=True)
class Hardware:
    """One node: its GPUs, their memory and bandwidth, and the rental price per GPU-hour."""

    gpus: int
    hbm_bytes_per_gpu: float
    hbm_bandwidth_bytes_per_s_per_gpu: float
    usd_per_gpu_hour: Decimal

    def __post_init__(self) -> None:
        if self.gpus < 1:
            raise ValueError(f"GPU count must be positive, got {self.gpus}")
        if not self.hbm_bytes_per_gpu > 0:
            raise ValueError(f"HBM per GPU must be positive, got {self.hbm_bytes_per_gpu}")
        if not self.hbm_bandwidth_bytes_per_s_per_gpu > 0:
            raise ValueError(f"HBM bandwidth must be positive, got {self.hbm_bandwidth_bytes_per_s_per_gpu}")
        if not self.usd_per_gpu_hour > 0:
            raise ValueError(f"price per GPU-hour must be positive, got {self.usd_per_gpu_hour}")

    @property
    def hbm_bytes(self) -> float:
        """Memory of the whole node."""
        return self.gpus * self.hbm_bytes_per_gpu

    @property
    def bandwidth_bytes_per_s(self) -> float:
        """Aggregate HBM bandwidth: tensor parallelism splits every read across all GPUs."""
        return self.gpus * self.hbm_bandwidth_bytes_per_s_per_gpu

    @property
    def usd_per_hour(self) -> Decimal:
        """Rental price of the whole node per hour."""
        return self.gpus * self.usd_per_gpu_hour


HARDWARE_PRESETS: dict[str, Hardware] = {
    # NVIDIA H100 SXM datasheet: 80 GB HBM3 at 3.35 TB/s. Lambda on-demand $3.99/GPU-hour, as in the
    # worked example of shared/inference-economics.txt (list price at the time of writing).
    "8xH100-SXM": Hardware(8, 80e9, 3.35e12, Decimal("3.99")),
    # NVIDIA H200 datasheet: 141 GB HBM3e at 4.8 TB/s. Price is an assumption: comparisons of 2025
    # cloud listings put the H200 about $0.90-1.20/GPU-hour above the H100 (deploybase.ai, "H100 vs
    # H200", Sept 2025), so $3.99 + $1.00. Override with --gpu-hour-usd for a real quote.
    "8xH200": Hardware(8, 141e9, 4.8e12, Decimal("4.99")),
}


# The worked example of shared/inference-economics.txt, and the target the GPU-timed fake engine is timed
# after: Llama 3.1 70B in FP8 (70.6 GB of weights, 320 KiB of KV cache per token), 4,096-token context.
LLAMA_70B_FP8 = ModelShape(weight_bytes=70.6e9, kv_bytes_per_token=327680.0)
EXAMPLE_CONTEXT = 4096
EXAMPLE_HARDWARE = "8xH100-SXM"


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
                    "usd_per_mtok": str(r.usd_per_mtok.quantize(Decimal("0.000001"), ROUND_HALF_UP)),
                    "memory_gb": round(r.memory_gb, 3),
                    "fits": r.fits,
                }
                for r in self.rows
            ],
            "knee_batch_size": self.knee_batch_size,
            "max_batch_size": self.max_batch_size,
        }


def _check_context(context: int) -> None:
    if context < 1:
        raise ValueError(f"context must be a positive number of tokens, got {context}")


def memory_bytes(model: ModelShape, context: int, batch_size: int) -> float:
    """Weights plus the KV cache of `batch_size` sequences of `context` tokens."""
    return model.weight_bytes + batch_size * model.kv_bytes_per_sequence(context)


def step_seconds(model: ModelShape, hardware: Hardware, context: int, batch_size: int) -> float:
    """One decode step (TPOT): every byte it reads, over the node's aggregate bandwidth."""
    return memory_bytes(model, context, batch_size) / hardware.bandwidth_bytes_per_s


def usd_per_mtok(model: ModelShape, hardware: Hardware, context: int, batch_size: int) -> Decimal:
    """Node $/s over node tokens/s, per million tokens, in exact Decimal from the inputs."""
    step_bytes = Decimal(repr(memory_bytes(model, context, batch_size)))
    bandwidth = Decimal(repr(hardware.bandwidth_bytes_per_s))
    return hardware.usd_per_hour * step_bytes * _MILLION / (_SECONDS_PER_HOUR * bandwidth * batch_size)


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


def plan(model: ModelShape, hardware: Hardware, context: int, batch_sizes: Iterable[int] | None = None) -> Plan:
    """Roofline rows for each batch size (default: powers of two, the knee and the memory limit)."""
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
    )
