"""The engine side: engine runs (cost accounting), claim leases, worker heartbeats, the fleet's backlog sums."""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Float,
    Index,
    Integer,
    String,
    Text,
)
from sqlalchemy.orm import Mapped, mapped_column

from storage.models.base import Base


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


class ModelBacklog(Base):
    """A model's open backlog as the fleet last summed it (storage/queue/fleet_backlog.py): one worker re-sums it when
    it is older than the urgency horizon's age limit and the others read this row, so a fleet of N processes sums the
    queue once per interval, not N times."""

    __tablename__ = "model_backlogs"

    model: Mapped[str] = mapped_column(String(200), primary_key=True)
    requests: Mapped[int] = mapped_column(BigInteger, default=0)
    input_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    output_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    lora_work: Mapped[float] = mapped_column(Float, default=0.0)  # adapter lines' LoRA overhead (output-token work)
    summed_at: Mapped[float] = mapped_column(Float, default=0.0)  # unix seconds; 0: never summed yet
