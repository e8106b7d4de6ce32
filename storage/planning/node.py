"""What the planner plans for: a model's shape (weights, parameters, KV cache per token) and a node's hardware.

The roofline (roofline.py) and the step-time formula (step_time.py) read these; the presets are the
datasheet numbers of the GPUs the docs cost. GB means 1e9 bytes, TFLOPS 1e12 FLOP/s.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

GB = 1e9


@dataclass(frozen=True)
class Bound:
    """The accepted range of one planner input (the API's `ge`/`le` and the CLI's check use the same)."""

    low: float
    high: float

    def check(self, name: str, value: float | Decimal) -> None:
        """ValueError naming the input unless low <= value <= high (and finite)."""
        if not self.low <= value <= self.high:
            raise ValueError(f"{name} must be between {self.low:g} and {self.high:g}, got {value}")


# NVIDIA H100 SXM datasheet, dense (the "with sparsity" figures are twice these): FP8 and BF16 tensor cores.
H100_FP8_FLOPS = 1979e12
H100_BF16_FLOPS = 989e12
# The share of those FLOP/s a prefill reaches. 0.5 is what docs/scaling.md assumed ("50% utilisation",
# ~56,000 prompt tokens/s for 70B FP8 on 8x H100); large dense GEMMs on H100 reach 60-75% of the datasheet
# in FP8, and a whole forward pass (attention, norms, tensor-parallel all-reduces over NVLink) less.
PREFILL_EFFICIENCY = 0.5

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
    "prompt_tokens": Bound(1, 10_000_000),
    "output_tokens": Bound(1, 10_000_000),
    "requests": Bound(1, 1e12),
    "max_num_seqs": Bound(1, 10_000_000),
    "max_num_batched_tokens": Bound(1, 10_000_000),
    "efficiency": Bound(0.01, 1),
}

WEIGHT_DTYPE_BYTES: dict[str, float] = {"fp32": 4.0, "bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "int4": 0.5}
KV_DTYPE_BYTES: dict[str, float] = {"fp32": 4.0, "bf16": 2.0, "fp16": 2.0, "fp8": 1.0}
# config.json "torch_dtype" -> our dtype names; vLLM's kv_cache_dtype "auto" follows the model dtype.
_TORCH_DTYPES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}
# Families whose MLP is a plain up/down projection; everything else is assumed gated (SwiGLU: 3 mats).
_UNGATED_MODEL_TYPES = frozenset({"gpt2", "gpt_neox", "gptj", "opt", "bloom", "falcon", "phi", "bert"})


@dataclass(frozen=True)
class ModelShape:
    """What a step must read (the weights, the KV cache per token of context) and multiply (the parameters).

    `parameters` defaults to the weight bytes over the bytes of `weight_dtype` (FP8 unless told): the
    worked example's 70.6 GB of FP8 weights are its 70.6 B parameters. The dtype also picks the node's
    FLOP rate (FP8 weights run on FP8 tensor cores; every other dtype at the 16-bit rate).
    """

    weight_bytes: float
    kv_bytes_per_token: float
    parameters: float | None = None
    weight_dtype: str = "fp8"

    def __post_init__(self) -> None:
        if not self.weight_bytes > 0:
            raise ValueError(f"weight bytes must be positive, got {self.weight_bytes}")
        if not self.kv_bytes_per_token > 0:
            raise ValueError(f"KV bytes per token must be positive, got {self.kv_bytes_per_token}")
        if self.weight_dtype not in WEIGHT_DTYPE_BYTES:
            raise ValueError(f"unknown weight dtype {self.weight_dtype!r}: use one of {', '.join(WEIGHT_DTYPE_BYTES)}")
        if self.parameters is not None and not self.parameters > 0:
            raise ValueError(f"parameter count must be positive, got {self.parameters}")

    @property
    def parameter_count(self) -> float:
        """Parameters a token is multiplied through (2 FLOPs each): given, or weight bytes / dtype bytes."""
        return self.parameters or self.weight_bytes / WEIGHT_DTYPE_BYTES[self.weight_dtype]

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
        parameters = dims.parameter_count()
        return cls(
            weight_bytes=parameters * WEIGHT_DTYPE_BYTES[weight_dtype],
            kv_bytes_per_token=2 * dims.layers * dims.kv_heads * dims.head_dim * KV_DTYPE_BYTES[kv_dtype],
            parameters=float(parameters),
            weight_dtype=weight_dtype,
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
    """One node: its GPUs, their memory, bandwidth and dense tensor-core FLOP/s, and the price per GPU-hour.

    `compute_efficiency` is the share of the datasheet FLOP/s a prefill reaches (model FLOPs utilisation);
    0.5 by default, the figure docs/scaling.md assumed: see PREFILL_EFFICIENCY.
    """

    gpus: int
    hbm_bytes_per_gpu: float
    hbm_bandwidth_bytes_per_s_per_gpu: float
    usd_per_gpu_hour: Decimal
    fp8_flops_per_s_per_gpu: float = H100_FP8_FLOPS
    bf16_flops_per_s_per_gpu: float = H100_BF16_FLOPS
    compute_efficiency: float = PREFILL_EFFICIENCY

    def __post_init__(self) -> None:
        if self.gpus < 1:
            raise ValueError(f"GPU count must be positive, got {self.gpus}")
        if not self.hbm_bytes_per_gpu > 0:
            raise ValueError(f"HBM per GPU must be positive, got {self.hbm_bytes_per_gpu}")
        if not self.hbm_bandwidth_bytes_per_s_per_gpu > 0:
            raise ValueError(f"HBM bandwidth must be positive, got {self.hbm_bandwidth_bytes_per_s_per_gpu}")
        if not self.usd_per_gpu_hour > 0:
            raise ValueError(f"price per GPU-hour must be positive, got {self.usd_per_gpu_hour}")
        if not (self.fp8_flops_per_s_per_gpu > 0 and self.bf16_flops_per_s_per_gpu > 0):
            raise ValueError("FLOP/s per GPU must be positive")
        if not 0 < self.compute_efficiency <= 1:
            raise ValueError(f"compute efficiency must be in (0, 1], got {self.compute_efficiency}")

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

    def flops_per_s(self, weight_dtype: str) -> float:
        """The node's usable FLOP/s for weights of `weight_dtype`: datasheet dense rate x GPUs x efficiency."""
        per_gpu = self.fp8_flops_per_s_per_gpu if weight_dtype == "fp8" else self.bf16_flops_per_s_per_gpu
        return self.gpus * per_gpu * self.compute_efficiency


HARDWARE_PRESETS: dict[str, Hardware] = {
    # Both presets compute at the H100's dense tensor-core rates (the H200 is the same GH100 die with
    # more, faster memory): 1,979 TFLOPS FP8 and 989 TFLOPS BF16, NVIDIA's datasheet figures without sparsity.
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
