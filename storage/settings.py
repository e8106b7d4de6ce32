"""Backfill settings: one prefix (BACKFILL_), read once through get_settings()."""

from __future__ import annotations

import json
import re
from decimal import Decimal
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, PositiveInt, ValidationError, field_validator, model_validator
from pydantic_settings import SettingsConfigDict
from pydantic_settings.exceptions import SettingsError as PydanticSettingsError

from storage.endpoints import MODERATIONS_URL
from storage.outbound_settings import OutboundSettings
from storage.registry import (
    ModelSpec,
    default_embedding_model,
    demo_embedding_model,
    demo_lora_model,
    demo_moderation_model,
    demo_vl_model,
)
from storage.windows import BACKGROUND_WINDOW, offered_windows


class SettingsError(RuntimeError):
    """A setting is missing or malformed; the message names the BACKFILL_ variable."""


class TenantQuota(BaseModel):
    """One tenant's quotas, overriding the `tenant_max_*` defaults field by field (0: unlimited)."""

    model_config = {"extra": "forbid"}

    max_files: int | None = Field(default=None, ge=0)
    max_stored_bytes: int | None = Field(default=None, ge=0)
    max_open_batches: int | None = Field(default=None, ge=0)
    max_priority: int | None = Field(default=None, ge=-100, le=100)  # the highest `priority` its batches may take


# An object key prefix: "" or plain segments such as "backfill/prod" (no leading "/", "..", "a//b").
_PLAIN_KEY_PREFIX = r"^([A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)*)?$"


# Of a SIGTERM'd GPU worker's grace (`shutdown_grace_seconds`), what the drain leaves for the rest: the running
# engine step and task ending, the checkpoint write (384 sequences: under 1 s, docs/benchmarks.md), the
# wake-up and the process exit. Generous on purpose: a shorter drain loses no work (what did not finish resumes
# from its checkpoint), a SIGKILL before the write loses the decode since the last periodic checkpoint.
SHUTDOWN_MARGIN_SECONDS = 10


class Settings(OutboundSettings):
    """Every knob of Backfill. Unset database/objects/broker means the embedded default."""

    model_config = SettingsConfigDict(env_prefix="BACKFILL_", extra="ignore")

    data_dir: Path = Path("./.backfill")
    database_url: str | None = None
    redis_url: str | None = None
    s3_endpoint_url: str | None = None
    s3_bucket: str | None = None
    s3_region: str = "us-east-1"
    # The part size too: with four parts in flight an upload holds ~5 parts (40 MiB); 10,000 parts = 80 GB.
    s3_multipart_threshold_bytes: int = Field(default=8 * 1024 * 1024, ge=5 * 1024 * 1024)

    # Upload and batch limits (OpenAI's defaults).
    upload_max_bytes: int = Field(default=200 * 1024 * 1024, ge=1)
    batch_max_requests: int = Field(default=50_000, ge=1)
    # The Uploads API (api/openai/uploads.py, storage/files/uploads.py), OpenAI's limits: a file of up to 8 GB sent
    # in parts of up to 64 MB, completed within an hour of its creation. Every part but the last one listed must
    # hold at least `upload_part_min_bytes` (S3's multipart minimum, 5 MiB: lower it only for a store without it).
    upload_total_max_bytes: int = Field(default=8 * 1024**3, ge=1)
    upload_part_max_bytes: int = Field(default=64 * 1024**2, ge=1)
    upload_part_min_bytes: int = Field(default=5 * 1024**2, ge=1)
    upload_expires_seconds: int = Field(default=3600, ge=60, le=7 * 86400)
    line_max_bytes: int = Field(default=1024 * 1024, ge=1)
    # Anthropic Message Batches (Anthropic's limits): requests and body bytes per batch, and how long
    # results are kept after the batch ends before it is archived.
    message_batch_max_requests: int = Field(default=100_000, ge=1)
    message_batch_max_bytes: int = Field(default=256 * 1024 * 1024, ge=1)
    message_batch_retention_seconds: int = Field(default=29 * 86400, ge=60)
    stream_chunk_bytes: int = Field(default=1024 * 1024, ge=4096)
    # Retries per retry tree (storage/batches/retries.py): a tree holds its original and at most this many retries.
    retry_max_attempts: int = Field(default=10, ge=1, le=100)
    # Workflow (docs/workflow.md): the most lines a batch's trial may ask for (`trial: {"lines": n}`), and whether a
    # checked line's failed attempts are billed (their tokens added to the line's) or free (only the answer kept).
    trial_max_lines: int = Field(default=1000, ge=1, le=100_000)
    checks_bill_failed_attempts: bool = True
    # Threads serving (sync) API routes; each may hold one database connection, so the pool is sized to them.
    api_threads: int = Field(default=40, ge=1, le=1000)
    # Requests of one tenant in flight at once in one API process (api/fair_share.py); past it, 429 with
    # Retry-After. Unset: an eighth of `api_threads` (at least 1); 0: no limit. Routes are CPU-bound on one GIL:
    # a tenant gains no throughput from more threads at once, and every other tenant waits longer for the CPU.
    tenant_max_concurrent_requests: int | None = Field(default=None, ge=0, le=1000)
    sql_echo: bool = False  # log every SQL statement with its parameters (tenant ids, key hashes): debugging only

    # Completion windows offered -> discount (fraction of list price). "24h" is always offered. "background"
    # (no deadline, spare capacity only) must take a deeper discount than "24h"; leave it out to not offer it.
    completion_windows: dict[str, Decimal] = Field(
        default_factory=lambda: {"24h": Decimal("0.5"), BACKGROUND_WINDOW: Decimal("0.6")}
    )

    # Prices: the node's rent and the online list prices that batch discounts are taken from.
    gpu_count: int = Field(default=8, ge=1)
    gpu_hour_usd: Decimal = Field(default=Decimal("3.99"), gt=0)
    price_book: dict[str, Any] = Field(default_factory=dict)
    prefill_weight: Decimal = Field(default=Decimal("0.2"), ge=0, le=1)

    # Models served: name -> spec. Empty means the embedded demo model under data_dir.
    models: dict[str, ModelSpec] = Field(default_factory=dict)
    # The model a /v1/moderations line that names none runs on (OpenAI's `model` is optional there). Unset: the
    # first served model that classifies (`"runner": "pooling", "convert": "classify"`).
    moderation_model: str | None = Field(default=None, max_length=256)
    worker_model: str | None = None
    # LoRA adapters (docs/adapters.md): the bounds of what `POST /v1/adapters` registers and a batch names.
    adapter_max_bytes: int = Field(default=256 * 1024 * 1024, ge=1)  # an adapter's files together
    adapters_per_tenant_max: int = Field(default=100, ge=0)  # registered adapters scoped to one tenant
    batch_max_adapters: int = Field(default=64, ge=1)  # distinct adapters one batch's lines may name
    # Model switching (docs/model-switching.md): a GPU worker serving several models, one loaded at a time.
    worker_models: str | None = None  # "a,b" or "all"; unset: the one model of BACKFILL_WORKER_MODEL
    switch_min_residency_seconds: int = Field(default=300, ge=0)  # never leave a model with work sooner
    switch_reload_seconds: int = Field(default=120, ge=0)  # a model's load time until one is measured
    switch_check_seconds: int = Field(default=10, ge=1)  # how often the backlog is re-read to decide
    switch_drain_seconds: int = Field(default=30, ge=0)  # in-flight work may finish this long, then goes back
    # A GPU worker told to stop (SIGTERM) lets in-flight work finish this long, then hands the rest back to
    # the queue with their checkpoints (worker/process/shutdown.py). `shutdown_grace_seconds` is the time it
    # has from SIGTERM to exit (a spot reclaim notice: 30 s on GCP/Azure, 120 s on AWS; the pod's
    # terminationGracePeriodSeconds): the drain is cut so that SHUTDOWN_MARGIN_SECONDS remain for the
    # checkpoint write and the exit (`shutdown_drain_budget`).
    shutdown_drain_seconds: int = Field(default=10, ge=0)
    shutdown_grace_seconds: int = Field(default=30, ge=0)
    # Generation checkpoints (docs/workers.md): every hand-back stores each in-flight request's generated token
    # ids with its row; besides, every `checkpoint_interval_seconds` (checked between engine steps) a request that has
    # generated `checkpoint_every_tokens` more since its last checkpoint is stored too (0: only at hand-backs).
    # A kill -9 loses at most those two bounds' worth of a request's tokens; smaller values write more.
    checkpoint_every_tokens: int = Field(default=1024, ge=0)
    checkpoint_interval_seconds: float = Field(default=60.0, gt=0)

    # Worker and queue.
    lease_seconds: int = Field(default=120, ge=5)
    run_task_seconds: int = Field(default=300, ge=5)
    engine_run_max_seconds: int = Field(default=600, ge=5)  # cost attribution closes a run at least this often
    broker_visibility_timeout_seconds: int = Field(default=3600, ge=60)
    reap_interval_seconds: int = Field(default=15, ge=1)
    expiry_cut_grace_seconds: int = Field(default=10, ge=0, le=600)  # workers cut lines at expiry (queue/expiry.py)
    # Liveness (docs/workers.md): a GPU worker writes its heartbeat row and renews its held leases this often,
    # also between tasks; a row older than worker_stale_seconds means the worker is gone and its leases are
    # released at once. A worker restarted under the same BACKFILL_WORKER_SLOT on its host (or whose
    # predecessor's process is gone) takes the predecessor's leases back at start.
    heartbeat_seconds: int = Field(default=2, ge=1, le=60)
    worker_stale_seconds: int = Field(default=15, ge=3, le=3600)
    worker_slot: str | None = Field(default=None, max_length=64)
    inflight_per_seq: int = Field(default=2, ge=1)
    # An ingest that fails with an error no line explains is retried after 5, 10, 20 ... s, then fails its batch.
    ingest_max_attempts: int = Field(default=5, ge=1, le=100)
    ingest_retry_seconds: int = Field(default=5, ge=0, le=3600)

    # Deadline-aware packing (storage/queue/claim.py `claim`). A request is urgent, and claimed ahead of
    # the fair share, once its deadline is nearer than the larger of `urgent_within_seconds` and
    # `urgent_drain_multiple` x the time the node needs to drain the model's backlog at measured speed.
    urgent_within_seconds: int = Field(default=900, ge=0)
    urgent_drain_multiple: float = Field(default=1.5, ge=0)
    # Prefix-aware ordering: within a deadline bucket, requests sharing a prompt prefix are claimed together.
    prefix_ordering: bool = True
    prefix_deadline_bucket_seconds: int = Field(default=3600, ge=1)
    prefix_chars: int = Field(default=512, ge=1)  # completions: the first N characters form the prefix
    # Admission at ingest: "warn" accepts a job that is estimated to miss its window (or make others miss
    # theirs) with a warning on the batch, "reject" fails it (`deadline_infeasible`), "off" skips the check.
    admission_policy: Literal["off", "warn", "reject"] = "warn"
    # Estimated input tokens a tenant may have enqueued per model (OpenAI's enqueued token limit); None is
    # unlimited. `enqueued_token_limits` overrides it per tenant (JSON: tenant name or id -> tokens).
    enqueued_token_limit: int | None = Field(default=None, ge=1)
    enqueued_token_limits: dict[str, PositiveInt] = Field(default_factory=dict)
    # Per-tenant quotas (storage/quotas.py), 0 for unlimited: live files (uploads and results), their stored
    # bytes, and batches not yet ended (both protocols). A create past one answers 429 `quota_exceeded`.
    # `tenant_quotas` overrides them per tenant (JSON: tenant name or id -> {"max_files", ...}).
    tenant_max_files: int = Field(default=10_000, ge=0)
    tenant_max_stored_bytes: int = Field(default=100 * 1024**3, ge=0)
    tenant_max_open_batches: int = Field(default=1_000, ge=0)
    tenant_quotas: dict[str, TenantQuota] = Field(default_factory=dict)
    # The highest batch `priority` (-100..100) a tenant may set; `tenant_quotas` overrides it per tenant
    # ({"max_priority": 50}). 0 by default: raising a batch above the default takes the operator's grant.
    tenant_max_priority: int = Field(default=0, ge=-100, le=100)

    # Metrics (docs/operations.md). Workers and beat serve /metrics on `metrics_port` (0: off); the API on
    # its own port. Set `metrics_token` to require `Authorization: Bearer <token>` on the API's /metrics.
    metrics_port: int = Field(default=9464, ge=0, le=65535)
    metrics_token: str | None = Field(default=None, min_length=1)  # required by `serve` beyond loopback
    metrics_cache_seconds: float = Field(default=10.0, ge=0, le=300)  # queue gauges: one DB read per interval
    metrics_tenants_max: int = Field(default=50, ge=0, le=1000)  # tenants labelled by name; the rest "_other"
    metrics_goodput_window_seconds: int = Field(default=86400, ge=60)  # goodput of batches due since then or later
    # Object layout (storage/files/blobs/layout.py): keys start with this prefix (no leading or trailing "/").
    object_prefix: str = Field(default="", pattern=_PLAIN_KEY_PREFIX, max_length=200)
    # Presigned links (a Backfill extension): default and longest expiry; S3 signs for at most 7 days.
    presign_default_seconds: int = Field(default=3600, ge=1, le=604800)
    presign_max_seconds: int = Field(default=604800, ge=1, le=604800)
    # OpenAI's fields and retention (docs/openai-compatibility.md). Uploads with purpose=batch expire this long
    # after creation unless `expires_after` says otherwise (0: never, else OpenAI's 3600..2592000); the
    # retention sweep deletes expired files' objects and rows, at most `retention_sweep_max_files` per pass.
    batch_file_expires_seconds: int = Field(default=30 * 86400, ge=0, le=30 * 86400)
    retention_sweep_max_files: int = Field(default=100, ge=1, le=10_000)
    # Prompt tokens served from the engine's prefix cache are billed at the price book's cached-input price,
    # by default the list input price x this factor.
    cached_input_price_factor: Decimal = Field(default=Decimal("0.5"), ge=0, le=1)

    @field_validator(
        "price_book", "models", "enqueued_token_limits", "tenant_quotas", "completion_windows", mode="before"
    )
    @classmethod
    def _parse_json(cls, value: Any) -> Any:
        return json.loads(value) if isinstance(value, str) else value

    @field_validator("completion_windows")
    @classmethod
    def _windows_valid(cls, value: dict[str, Decimal]) -> dict[str, Decimal]:
        return offered_windows(value)

    @field_validator("batch_file_expires_seconds")
    @classmethod
    def _expiry_in_range(cls, value: int) -> int:
        if 0 < value < 3600:
            raise ValueError("must be 0 (never) or between 3600 and 2592000 seconds")
        return value

    @field_validator("database_url")
    @classmethod
    def _database_known(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(("postgresql", "sqlite")):
            raise ValueError("must start with postgresql:// or sqlite://")
        return value

    @model_validator(mode="after")
    def _s3_complete(self) -> Settings:
        if self.s3_endpoint_url and not self.s3_bucket:
            raise ValueError("BACKFILL_S3_BUCKET is required when BACKFILL_S3_ENDPOINT_URL is set")
        if self.presign_default_seconds > self.presign_max_seconds:
            raise ValueError("BACKFILL_PRESIGN_DEFAULT_SECONDS must not exceed BACKFILL_PRESIGN_MAX_SECONDS")
        return self

    @property
    def embedded(self) -> bool:
        """True when no broker is configured: the worker runs inside the API process."""
        return self.redis_url is None

    @property
    def sqlalchemy_url(self) -> str:
        """The database URL, defaulting to a SQLite file under data_dir."""
        if self.database_url:
            url = self.database_url
            if url.startswith("postgresql://"):
                url = "postgresql+psycopg://" + url.removeprefix("postgresql://")
            return url
        return f"sqlite:///{(self.data_dir / 'backfill.db').resolve()}"

    @property
    def tenant_request_share(self) -> int:
        """Requests of one tenant in flight at once in one API process; 0: no limit."""
        share = self.tenant_max_concurrent_requests
        return max(1, self.api_threads // 8) if share is None else share

    def shutdown_drain_budget(self, *, elapsed: float = 0.0) -> float:
        """Seconds a SIGTERM'd worker may still drain, `elapsed` after the signal: what leaves it
        SHUTDOWN_MARGIN_SECONDS of its grace to write the checkpoints and exit (never negative)."""
        left = self.shutdown_grace_seconds - SHUTDOWN_MARGIN_SECONDS - elapsed
        return max(0.0, min(float(self.shutdown_drain_seconds), left))

    def served_models(self) -> dict[str, ModelSpec]:
        """The model registry; the embedded default serves the locally built demo models (chat, vision-language,
        Matryoshka embeddings, moderation) and MiniLM embeddings."""
        if self.models:
            return self.models
        # float32: on CPUs without AVX-512 vLLM's bf16 kernels are ~3x slower for this tiny model. Its template
        # writes Hermes-style tool calls and DeepSeek-R1-style thinking, which vLLM's parsers read back.
        demo = ModelSpec(
            path=str((self.data_dir / "models" / "backfill-demo").resolve()),
            dtype="float32",
            tool_parser="hermes",
            reasoning_parser="deepseek_r1",
        )
        return {
            "backfill-demo": demo,
            **demo_vl_model(self.data_dir),
            **default_embedding_model(),
            **demo_embedding_model(self.data_dir),
            **demo_moderation_model(self.data_dir),
            **demo_lora_model(self.data_dir, demo),
        }

    @model_validator(mode="after")
    def _moderation_model_served(self) -> Settings:
        name = self.moderation_model
        if name is not None and not (
            name in self.served_models() and self.served_models()[name].serves(MODERATIONS_URL)
        ):
            raise ValueError(f"BACKFILL_MODERATION_MODEL={name!r} is not a served classifier (see BACKFILL_MODELS)")
        return self

    def default_models(self) -> dict[str, str]:
        """endpoint -> the model a line of it that names no model runs on: /v1/moderations only, as at OpenAI
        (BACKFILL_MODERATION_MODEL, else the first served classifier; none: such lines need `model`)."""
        served = self.served_models()
        name = self.moderation_model
        if name is None:
            name = next((model for model, spec in served.items() if spec.serves(MODERATIONS_URL)), None)
        return {} if name is None else {MODERATIONS_URL: name}

    def current_worker_model(self) -> str:
        """The model this worker serves: the setting, or the only/first registry entry."""
        models = self.served_models()
        name = self.worker_model or next(iter(models))
        if name not in models:
            raise SettingsError(f"BACKFILL_WORKER_MODEL={name!r} is not in BACKFILL_MODELS")
        return name

    def current_worker_models(self) -> list[str]:
        """The models this worker serves one at a time: BACKFILL_WORKER_MODELS, else the one worker model."""
        if not self.worker_models:
            return [self.current_worker_model()]
        models = self.served_models()
        if self.worker_models.strip() == "all":
            return list(models)
        names = [name.strip() for name in self.worker_models.split(",") if name.strip()]
        unknown = [name for name in names if name not in models]
        if unknown or not names:
            raise SettingsError(f"BACKFILL_WORKER_MODELS={self.worker_models!r}: not in BACKFILL_MODELS: {unknown}")
        return list(dict.fromkeys(names))


def _describe(error: ValidationError) -> str:
    parts = []
    for item in error.errors():
        field = ".".join(str(p) for p in item["loc"]) or "settings"
        name = f"BACKFILL_{field.split('.')[0].upper()}" if item["loc"] else "BACKFILL_*"
        parts.append(f"{name}: {item['msg']}")
    return "; ".join(parts)


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """Read and validate settings once; raise SettingsError naming the bad variable."""
    try:
        return Settings()
    except ValidationError as error:
        raise SettingsError(f"invalid setting: {_describe(error)}") from None
    except PydanticSettingsError as error:  # a complex value that is not JSON
        match = re.search(r'field "(\w+)"', str(error))
        name = f"BACKFILL_{match.group(1).upper()}" if match else "a BACKFILL_ variable"
        raise SettingsError(f"invalid setting: {name}: not valid JSON") from None
