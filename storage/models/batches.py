"""Batches and their queue rows (one per JSONL line), with the rows' checkpoints (their counts and chunks)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    String,
    Text,
    UniqueConstraint,
    false,
    func,
    select,
)
from sqlalchemy.orm import Mapped, column_property, mapped_column

from storage.models.base import Base
from storage.protocols import OPENAI


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
    # When admission predicted the batch would finish (unix seconds; storage/batches/window_menu.py): its finish is
    # checked against it when it ends (storage/batches/finish_predictions.py). None: made before 0025, or a retry.
    predicted_finish_at: Mapped[int | None] = mapped_column(BigInteger)
    on_expiry: Mapped[str | None] = mapped_column(String(32))  # None: cut short at expiry (docs/workflow.md)


class Checkpoint(Base):
    """How far a queue row's checkpoint reaches, and under which claim it grows (storage/queue/checkpoints.py).

    One per row a claim took (or a continuation seeded): `tokens` is how many generated ids its chunks hold end
    to end, `claim_id` the claim whose generation alone may append to them ("" for a copy no claim took yet). A
    write moves `tokens` from the count it read, guarded by the claim; a claim moves `claim_id` to its own. This
    row, not the queue row, is what writers of one request's checkpoint serialize on.

    On Postgres this table and `checkpoint_chunks` are UNLOGGED, with no foreign key (whose check would lock
    the queue row): a checkpoint writes no WAL. A crash of the database (or a failover) empties both, and the
    claims that follow start those generations from token 0: work decoded again, no answer lost or changed
    (docs/workers.md, "Checkpoints and resume").
    """

    __tablename__ = "checkpoints"

    request_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    claim_id: Mapped[str] = mapped_column(String(32), default="", server_default="")
    tokens: Mapped[int] = mapped_column(Integer, default=0, server_default="0")


class BatchRequest(Base):
    """One JSONL line of a batch: the queue row of record, later its result."""

    __tablename__ = "batch_requests"
    __table_args__ = (
        UniqueConstraint("batch_id", "custom_id", name="uq_batch_requests_batch_id_custom_id"),
        # In the urgent claim's order (EDF: storage/queue/claim_order.py `_EDF_ORDER`), so a claim reads its rows off
        # the index instead of sorting every urgent row of the backlog (a second at 100,000 rows: bench/fleet.py).
        # It carries each row's size (Postgres: INCLUDE), so a model's open backlog, which every worker sums for its
        # urgency horizon (storage/queue/backlog.py `backlog`), is read off the index alone, not the rows' heap.
        Index(
            "ix_batch_requests_queue",
            "model",
            "status",
            "deadline",
            "prefix_key",
            "batch_id",
            "line",
            postgresql_include=["est_input_tokens", "max_output_tokens"],
        ),
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
    # resumes the generation from them instead of decoding them again (storage/queue/checkpoints.py). Read from
    # the row's `Checkpoint` (0 without one), never stored on the row: a checkpoint writes no queue row.
    if TYPE_CHECKING:  # mapped below the class (it reads `Checkpoint` by this class's id)
        checkpoint_tokens: Mapped[int]
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
    # While a checked line is open: the draws it made that failed its checks and their usage, so a claim after a
    # hand-back goes on with the next draw (storage/queue/draws.py). Never shown: `check_attempts` is.
    draws: Mapped[dict[str, Any] | None] = mapped_column(JSON)


BatchRequest.checkpoint_tokens = column_property(
    select(func.coalesce(func.max(Checkpoint.tokens), 0))
    .where(Checkpoint.request_id == BatchRequest.id)
    .correlate_except(Checkpoint)
    .scalar_subquery()
)


class CheckpointChunk(Base):
    """A slice of a queue row's checkpoint: the token ids generated from `start` on, appended, never rewritten.

    A checkpoint write stores only the tokens since the row's last one, so its cost follows what was generated
    since, not the whole output (docs/workers.md, "Checkpoints and resume"); a claim reads the row's chunks in
    `start` order. They go when the row ends or its generation restarts from token 0.
    """

    __tablename__ = "checkpoint_chunks"

    request_id: Mapped[str] = mapped_column(String(64), primary_key=True)  # its row's; no foreign key (`Checkpoint`)
    start: Mapped[int] = mapped_column(Integer, primary_key=True)  # the index of its first token in the output
    token_ids: Mapped[bytes] = mapped_column(LargeBinary)  # packed int32, zlib (`pack_tokens`)
