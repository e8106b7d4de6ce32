"""ORM models: tenants, API keys, files, batches, batch requests, engine runs and webhooks."""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Text,
    UniqueConstraint,
    false,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from storage.protocols import OPENAI

NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)
    type_annotation_map = {dict[str, Any]: JSON, list[Any]: JSON}


class Tenant(Base):
    __tablename__ = "tenants"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    name: Mapped[str] = mapped_column(String(200), unique=True)
    created_at: Mapped[int] = mapped_column(BigInteger)
    # The admin-set budget per calendar month (UTC), micro-dollars; None: no budget (storage/finance/budgets.py).
    monthly_budget_micro_usd: Mapped[int | None] = mapped_column(BigInteger)


class ApiKey(Base):
    __tablename__ = "api_keys"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"), index=True)
    key_hash: Mapped[str] = mapped_column(String(64), unique=True)
    is_admin: Mapped[bool] = mapped_column(Boolean, default=False)
    created_at: Mapped[int] = mapped_column(BigInteger)
    revoked_at: Mapped[int | None] = mapped_column(BigInteger)


class File(Base):
    __tablename__ = "files"
    __table_args__ = (
        Index("ix_files_tenant_created", "tenant_id", "created_at"),
        Index("ix_files_expires_at", "expires_at"),  # the retention sweep reads the oldest expired first
    )

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    filename: Mapped[str] = mapped_column(String(512))
    purpose: Mapped[str] = mapped_column(String(32))
    bytes: Mapped[int] = mapped_column(BigInteger)
    blob_key: Mapped[str] = mapped_column(String(512))
    sha256: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[int] = mapped_column(BigInteger)
    deleted_at: Mapped[int | None] = mapped_column(BigInteger)
    expires_at: Mapped[int | None] = mapped_column(BigInteger)  # None: kept until deleted


class Batch(Base):
    __tablename__ = "batches"
    __table_args__ = (
        Index("ix_batches_tenant_created", "tenant_id", "created_at"),
        Index("ix_batches_status", "status"),
        Index("ix_batches_retry_of", "retry_of"),
        Index("ix_batches_retry_root", "retry_root"),
    )

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    input_file_id: Mapped[str] = mapped_column(String(64))
    endpoint: Mapped[str] = mapped_column(String(64))
    completion_window: Mapped[str] = mapped_column(String(16))
    model: Mapped[str | None] = mapped_column(String(200))
    status: Mapped[str] = mapped_column(String(16))
    metadata_: Mapped[dict[str, Any] | None] = mapped_column("metadata", JSON)
    errors: Mapped[list[Any] | None] = mapped_column(JSON)
    # Admission warnings (e.g. the job may miss its window), shaped like `errors`.
    warnings: Mapped[list[Any] | None] = mapped_column(JSON)
    output_file_id: Mapped[str | None] = mapped_column(String(64))
    error_file_id: Mapped[str | None] = mapped_column(String(64))
    # The key of manifest.json (storage/batches/manifests.py), written when the batch ended with results.
    manifest_key: Mapped[str | None] = mapped_column(String(512))
    # `output_expires_after.seconds`: the output and error files expire this long after they are written.
    output_expires_after_seconds: Mapped[int | None] = mapped_column(Integer)
    request_total: Mapped[int] = mapped_column(Integer, default=0)
    request_completed: Mapped[int] = mapped_column(Integer, default=0)
    request_failed: Mapped[int] = mapped_column(Integer, default=0)
    # Failed ingest attempts (an error no line explains) and when the next may run: bounded, then the batch fails.
    ingest_attempts: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    ingest_retry_at: Mapped[int | None] = mapped_column(BigInteger)
    # Of request_failed, those cancelled or expired (a protocol's counts may tell them apart).
    request_cancelled: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    request_expired: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    created_at: Mapped[int] = mapped_column(BigInteger)
    expires_at: Mapped[int] = mapped_column(BigInteger)
    in_progress_at: Mapped[int | None] = mapped_column(BigInteger)
    finalizing_at: Mapped[int | None] = mapped_column(BigInteger)
    completed_at: Mapped[int | None] = mapped_column(BigInteger)
    failed_at: Mapped[int | None] = mapped_column(BigInteger)
    expired_at: Mapped[int | None] = mapped_column(BigInteger)
    cancelling_at: Mapped[int | None] = mapped_column(BigInteger)
    cancelled_at: Mapped[int | None] = mapped_column(BigInteger)
    # Which API created the batch: a name of storage/protocols.py's table.
    protocol: Mapped[str] = mapped_column(String(16), default=OPENAI.name, server_default=OPENAI.name)
    archived_at: Mapped[int | None] = mapped_column(BigInteger)  # results removed after their retention
    deleted_at: Mapped[int | None] = mapped_column(BigInteger)  # deleted by its owner; kept for accounting
    # The ended batch whose failed requests this one re-runs (storage/batches/retries.py); None for a first attempt.
    retry_of: Mapped[str | None] = mapped_column(String(64))
    # Which attempt of its retry tree this batch is: 0 the original, n the nth retry created in the tree.
    attempt: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    # On a retry: its tree's original batch (storage/batches/retries.py reads a tree in one query); None on it.
    retry_root: Mapped[str | None] = mapped_column(String(64))
    # Batch control (storage/batches/control.py): paused batches get no claims; higher priority claims first.
    paused_at: Mapped[int | None] = mapped_column(BigInteger)
    priority: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    # `max_cost_usd` (a Backfill extension) in micro-dollars: billed cost at which the batch stops claiming.
    max_cost_micro_usd: Mapped[int | None] = mapped_column(BigInteger)
    # Workflow (storage/batches/trials.py, checks.py): the trial's spec and report, its status (`in_progress`: only
    # trial lines are claimed), and the checks every answer must pass.
    trial: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    trial_status: Mapped[str | None] = mapped_column(String(16))
    checks: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    on_expiry: Mapped[str | None] = mapped_column(String(32))  # None: cut short at expiry (docs/workflow.md)


class BatchRequest(Base):
    """One JSONL line of a batch: the queue row of record, later its result."""

    __tablename__ = "batch_requests"
    __table_args__ = (
        UniqueConstraint("batch_id", "custom_id", name="uq_batch_requests_batch_id_custom_id"),
        # In the urgent claim's order (EDF: storage/queue/claim_order.py `_EDF_ORDER`), so a claim reads its rows off
        # the index instead of sorting every urgent row of the backlog (a second at 100,000 rows: bench/fleet.py).
        Index("ix_batch_requests_queue", "model", "status", "deadline", "prefix_key", "batch_id", "line"),
        # A tenant's share in prefix-aware claim order (storage/queue/claim_order.py), read straight off the index.
        Index(
            "ix_batch_requests_prefix_queue",
            "model",
            "status",
            "tenant_id",
            "prefix_key",
            "deadline",
            "batch_id",
            "line",
        ),
        # `superseded` last: a retry reads only the latest failures of each batch of its tree off this index.
        Index("ix_batch_requests_batch_status", "batch_id", "status", "superseded"),
        Index("ix_batch_requests_lease_id", "lease_id"),  # the rows of an expired lease, released by the reaper
        Index("ix_batch_requests_lease_owner", "lease_owner"),  # a worker's leases, released when it is gone
        Index("ix_batch_requests_finished_at", "finished_at"),  # daily cost and usage reports
        # Covers cost attribution (storage/finance/attribution.py): a run's work per batch is read from the index alone.
        Index("ix_batch_requests_run_usage", "run_id", "status", "batch_id", "prompt_tokens", "completion_tokens"),
        Index("ix_batch_requests_batch_result_seq", "batch_id", "result_seq"),  # results while a batch runs
        Index("ix_batch_requests_batch_line", "batch_id", "line"),  # the merged view of a batch and its retries
    )

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    batch_id: Mapped[str] = mapped_column(ForeignKey("batches.id", ondelete="CASCADE"))
    tenant_id: Mapped[str] = mapped_column(String(64))
    line: Mapped[int] = mapped_column(Integer)
    custom_id: Mapped[str] = mapped_column(String(512))
    model: Mapped[str] = mapped_column(String(200))
    url: Mapped[str] = mapped_column(String(64))
    body: Mapped[dict[str, Any]] = mapped_column(JSON)
    status: Mapped[str] = mapped_column(String(16))
    deadline: Mapped[int] = mapped_column(BigInteger)
    # Hash of the prompt's leading part (chat: all messages but the last); claims keep equal keys together
    # so the engine's prefix cache serves them. "" when no other line of its file shares it (or embeddings).
    prefix_key: Mapped[str] = mapped_column(String(32), default="", server_default="")
    # Sized once at ingest so admission and estimates never parse bodies: input ~ line bytes / 4, output =
    # max_completion_tokens, max_tokens or 256 (0 for embeddings), as storage/planning/shapes.py sizes a file.
    est_input_tokens: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    max_output_tokens: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    lease_owner: Mapped[str | None] = mapped_column(String(128))
    # The claim's lease (`Lease`) whose expiry holds this row: a renewal writes that one row, not this one.
    lease_id: Mapped[str | None] = mapped_column(String(32))
    response_status: Mapped[int | None] = mapped_column(Integer)
    response_body: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    error_code: Mapped[str | None] = mapped_column(String(64))
    error_message: Mapped[str | None] = mapped_column(Text)
    prompt_tokens: Mapped[int] = mapped_column(Integer, default=0)
    completion_tokens: Mapped[int] = mapped_column(Integer, default=0)
    # Prompt tokens the engine served from its prefix cache (vLLM's num_cached_tokens): OpenAI's cached_tokens.
    cached_tokens: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    # Of completion_tokens, those spent thinking (OpenAI's reasoning_tokens; billed as output like the rest).
    reasoning_tokens: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    engine_seconds: Mapped[float] = mapped_column(Float, default=0.0)
    run_id: Mapped[str | None] = mapped_column(String(64))
    finished_at: Mapped[float | None] = mapped_column(Float)
    # The order a results reader first saw this finished request in (storage/queue/result_rows.py).
    result_seq: Mapped[int | None] = mapped_column(BigInteger)
    # How many generated token ids the row's checkpoint holds (its `CheckpointChunk`s, end to end): a claim
    # resumes the generation from them instead of decoding them again (storage/queue/checkpoints.py).
    checkpoint_tokens: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    # Retry trees (storage/queue/retry_rows.py): a row a retry copied (a later attempt of its line exists); on
    # the original batch's row of a line, its newest copy (the merged view reads one row per line); on a copy,
    # the row it copied (its line's previous attempt, shown while the copy runs).
    superseded: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    latest_copy: Mapped[str | None] = mapped_column(String(64))
    copy_of: Mapped[str | None] = mapped_column(String(64))
    # The claim that last leased the row (a new id per claim): its generation alone appends to the checkpoint,
    # so a late write from an earlier holder never lands on tokens a later one generated.
    claim_id: Mapped[str | None] = mapped_column(String(32))
    # The LoRA adapter of `model` the line named (docs/adapters.md); None: the base model itself.
    adapter: Mapped[str | None] = mapped_column(String(200))
    # A line its batch's trial runs first (storage/queue/trial_rows.py); a checked line's attempts, each failed
    # check named (worker/feed/checks.py), shown on its result line.
    trial: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    check_attempts: Mapped[dict[str, Any] | None] = mapped_column(JSON)


class CheckpointChunk(Base):
    """A slice of a queue row's checkpoint: the token ids generated from `start` on, appended, never rewritten.

    A checkpoint write stores only the tokens since the row's last one, so its cost follows what was generated
    since, not the whole output (docs/workers.md, "Checkpoints and resume"); a claim reads the row's chunks in
    `start` order. They go when the row ends or its generation restarts from token 0.
    """

    __tablename__ = "checkpoint_chunks"

    request_id: Mapped[str] = mapped_column(ForeignKey("batch_requests.id", ondelete="CASCADE"), primary_key=True)
    start: Mapped[int] = mapped_column(Integer, primary_key=True)  # the index of its first token in the output
    token_ids: Mapped[bytes] = mapped_column(LargeBinary)  # packed int32, zlib (`pack_tokens`)


class EngineRun(Base):
    """One stretch of engine work by one worker: busy time and tokens, for cost accounting."""

    __tablename__ = "engine_runs"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    worker_id: Mapped[str] = mapped_column(String(128))
    model: Mapped[str] = mapped_column(String(200))
    started_at: Mapped[float] = mapped_column(Float)
    ended_at: Mapped[float | None] = mapped_column(Float)
    busy_seconds: Mapped[float] = mapped_column(Float, default=0.0)
    steps: Mapped[int] = mapped_column(Integer, default=0)
    prompt_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    completion_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    requests_finished: Mapped[int] = mapped_column(Integer, default=0)
    running_seq_steps: Mapped[int] = mapped_column(BigInteger, default=0)
    queued_steps: Mapped[int] = mapped_column(Integer, default=0)
    queued_running_seq_steps: Mapped[int] = mapped_column(BigInteger, default=0)
    max_num_seqs: Mapped[int] = mapped_column(Integer, default=0)


class WebhookEndpoint(Base):
    """A tenant's registered receiver: where events go and the secret they are signed with."""

    __tablename__ = "webhook_endpoints"
    __table_args__ = (Index("ix_webhook_endpoints_tenant_created", "tenant_id", "created_at"),)

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    name: Mapped[str] = mapped_column(String(200))
    url: Mapped[str] = mapped_column(String(2048))
    event_types: Mapped[list[Any]] = mapped_column(JSON)
    # The signing key itself (HMAC needs it in clear), `whsec_` + base64; after a rotation that keeps the old
    # one active, deliveries carry a signature with each until `previous_secret_expires_at`.
    secret: Mapped[str] = mapped_column(String(128))
    previous_secret: Mapped[str | None] = mapped_column(String(128))
    previous_secret_expires_at: Mapped[int | None] = mapped_column(BigInteger)
    created_at: Mapped[int] = mapped_column(BigInteger)
    updated_at: Mapped[int] = mapped_column(BigInteger)


class WebhookEvent(Base):
    """The outbox: one row per event, written in the transaction of the status change it reports."""

    __tablename__ = "webhook_events"
    __table_args__ = (Index("ix_webhook_events_tenant_created", "tenant_id", "created_at"),)

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    type: Mapped[str] = mapped_column(String(64))
    subject_id: Mapped[str] = mapped_column(String(64))  # the batch the event is about
    body: Mapped[str] = mapped_column(Text)  # the exact JSON sent (and signed) on every attempt
    created_at: Mapped[int] = mapped_column(BigInteger)


class WebhookDelivery(Base):
    """One event for one endpoint: its `id` is the `webhook-id` header, the same on every retry."""

    __tablename__ = "webhook_deliveries"
    __table_args__ = (
        Index("ix_webhook_deliveries_due", "status", "next_attempt_at"),
        Index("ix_webhook_deliveries_endpoint_created", "endpoint_id", "created_at"),
    )

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    event_id: Mapped[str] = mapped_column(ForeignKey("webhook_events.id", ondelete="CASCADE"))
    endpoint_id: Mapped[str] = mapped_column(ForeignKey("webhook_endpoints.id", ondelete="CASCADE"))
    tenant_id: Mapped[str] = mapped_column(String(64))
    status: Mapped[str] = mapped_column(String(16))  # pending, delivered, failed
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    # When the next attempt is due; while an attempt is in flight, the end of its claim (a crashed sender's
    # delivery comes due again then). None once delivered or given up.
    next_attempt_at: Mapped[float | None] = mapped_column(Float)
    last_status_code: Mapped[int | None] = mapped_column(Integer)
    created_at: Mapped[int] = mapped_column(BigInteger)
    delivered_at: Mapped[int | None] = mapped_column(BigInteger)


class WebhookAttempt(Base):
    """One HTTP attempt of a delivery: what the receiver answered (a bounded prefix) or why it failed."""

    __tablename__ = "webhook_attempts"

    delivery_id: Mapped[str] = mapped_column(ForeignKey("webhook_deliveries.id", ondelete="CASCADE"), primary_key=True)
    number: Mapped[int] = mapped_column(Integer, primary_key=True)
    attempted_at: Mapped[float] = mapped_column(Float)
    duration_ms: Mapped[int] = mapped_column(Integer)
    status_code: Mapped[int | None] = mapped_column(Integer)
    error: Mapped[str | None] = mapped_column(String(500))
    response_body: Mapped[str | None] = mapped_column(Text)


class Lease(Base):
    """One claim's lease: its owner and expiry, which every queue row it leased points to (`lease_id`).

    A worker renews the few leases it holds (one row write each) instead of every row in flight; the reaper
    re-queues the running rows of an expired lease. No foreign key: a row ends or goes back with its `lease_id`
    cleared, and a lease with no running rows left is deleted by its worker's next renewal or by the reaper.
    """

    __tablename__ = "leases"
    # No index on `expires_at`: a renewal's update then stays HOT (no index entry written), and the reaper reads
    # this small table (a few rows per worker) whole every pass.
    __table_args__ = (Index("ix_leases_worker_id", "worker_id"),)

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    worker_id: Mapped[str] = mapped_column(String(128))
    expires_at: Mapped[float] = mapped_column(Float)


class WorkerHeartbeat(Base):
    """A live GPU worker process: who it is, where it runs, and when it last said so (docs/workers.md)."""

    __tablename__ = "worker_heartbeats"
    __table_args__ = (Index("ix_worker_heartbeats_host", "host"),)

    worker_id: Mapped[str] = mapped_column(String(128), primary_key=True)  # the lease owner of its rows
    host: Mapped[str] = mapped_column(String(255))
    pid: Mapped[int] = mapped_column(Integer)
    slot: Mapped[str | None] = mapped_column(String(64))  # BACKFILL_WORKER_SLOT: a restart under it takes over
    models: Mapped[str] = mapped_column(Text)  # comma-separated names it serves
    started_at: Mapped[float] = mapped_column(Float)
    heartbeat_at: Mapped[float] = mapped_column(Float)


class Upload(Base):
    """An Upload (OpenAI's Uploads API): a file sent in parts, assembled by the object store at complete
    (storage/files/uploads.py). `file_id` and `blob_key` are chosen at creation: the store's multipart upload
    is opened at that key, so completing it writes the file in place."""

    __tablename__ = "uploads"
    __table_args__ = (
        Index("ix_uploads_tenant_status", "tenant_id", "status"),  # quotas count the pending ones
        Index("ix_uploads_status_expires", "status", "expires_at"),  # the sweep: overdue and uncleared ones
    )

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    filename: Mapped[str] = mapped_column(String(512))
    purpose: Mapped[str] = mapped_column(String(32))
    mime_type: Mapped[str] = mapped_column(String(255))
    bytes: Mapped[int] = mapped_column(BigInteger)  # declared at creation; the listed parts must add up to it
    status: Mapped[str] = mapped_column(String(16))  # pending, completed, cancelled, expired
    created_at: Mapped[int] = mapped_column(BigInteger)
    expires_at: Mapped[int] = mapped_column(BigInteger)
    file_id: Mapped[str] = mapped_column(String(64))
    blob_key: Mapped[str] = mapped_column(String(512))
    store_upload_id: Mapped[str] = mapped_column(Text)  # S3's UploadId ("" on the local store)
    file_expires_after_seconds: Mapped[int | None] = mapped_column(Integer)
    parts_started: Mapped[int] = mapped_column(Integer, default=0, server_default="0")  # part numbers handed out
    # True once the store holds nothing of it but its completed file: parts aborted (cancel, expiry) or assembled.
    parts_cleared: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())


class UploadPart(Base):
    """One part of an Upload, stored by the object store under its part `number` (arrival order)."""

    __tablename__ = "upload_parts"
    __table_args__ = (UniqueConstraint("upload_id", "number"),)

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    upload_id: Mapped[str] = mapped_column(ForeignKey("uploads.id", ondelete="CASCADE"))
    number: Mapped[int] = mapped_column(Integer)
    bytes: Mapped[int] = mapped_column(BigInteger)
    etag: Mapped[str] = mapped_column(String(128))
    created_at: Mapped[int] = mapped_column(BigInteger)


class Adapter(Base):
    """A LoRA adapter registered through `POST /v1/adapters` (storage/adapters/registry.py): a PEFT folder the
    engine of `base_model` loads; `tenant_id` set: only that tenant's lines may name it."""

    __tablename__ = "adapters"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    name: Mapped[str] = mapped_column(String(200), unique=True)
    base_model: Mapped[str] = mapped_column(String(200))
    tenant_id: Mapped[str | None] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"), index=True)
    path: Mapped[str] = mapped_column(Text)
    rank: Mapped[int] = mapped_column(Integer)
    size_bytes: Mapped[int] = mapped_column(BigInteger)
    target_modules: Mapped[list[Any]] = mapped_column(JSON)
    created_at: Mapped[int] = mapped_column(BigInteger)
