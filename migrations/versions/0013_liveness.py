"""worker liveness: one heartbeat row per live GPU worker process

Revision ID: 0013_liveness
Revises: 0006_anthropic
Create Date: 2026-12-01 14:00:00.000000

`worker_heartbeats` lets a restarted worker take over its predecessor's leases at once and lets the reaper
release the leases of a worker whose heartbeat went stale, instead of waiting out each lease (docs/workers.md).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op


revision = "0013_liveness"
down_revision = "0006_anthropic"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "worker_heartbeats",
        sa.Column("worker_id", sa.String(length=128), nullable=False),
        sa.Column("host", sa.String(length=255), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("slot", sa.String(length=64), nullable=True),
        sa.Column("models", sa.Text(), nullable=False),
        sa.Column("started_at", sa.Float(), nullable=False),
        sa.Column("heartbeat_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("worker_id", name=op.f("pk_worker_heartbeats")),
    )
    op.create_index("ix_worker_heartbeats_host", "worker_heartbeats", ["host"])
    # The reaper and a restarting worker find a worker's leases by owner.
    op.create_index("ix_batch_requests_lease_owner", "batch_requests", ["lease_owner"])


def downgrade() -> None:
    op.drop_index("ix_batch_requests_lease_owner", table_name="batch_requests")
    op.drop_index("ix_worker_heartbeats_host", table_name="worker_heartbeats")
    op.drop_table("worker_heartbeats")
