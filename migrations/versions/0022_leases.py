"""leases: a lease per claim that its rows point to, renewed with one row write (issue 41 section 1)

Revision ID: 0022_leases
Revises: 0021_reasoning_tokens
Create Date: 2026-12-04 17:10:00.000000

A worker renewed its leases by rewriting every row it held every 2 s (`batch_requests.lease_expires_at`): at 768
rows in flight per node, ~24,600 row versions a second at 64 nodes. Now a claim inserts one `leases` row (its
owner and expiry) and stamps its queue rows with its id (`batch_requests.lease_id`, in the UPDATE that claims
them); a renewal moves the expiry of the few leases a worker holds. The guard that stores a result is unchanged
(`status = running AND lease_owner = worker`). Rows running at upgrade get one lease per owner, expiring at the
latest of their rows' expiries. Downgrading gives each running row its lease's expiry back.

`ix_batch_requests_queue` gains the urgent claim's order (deadline, prefix_key, batch_id, line): with a deep
urgent backlog a claim sorted every urgent row (0.9-1.5 s at 100,000 queued rows, bench/fleet.py).
"""

from __future__ import annotations

import uuid

import sqlalchemy as sa
from alembic import op

revision = "0022_leases"
down_revision = "0021_reasoning_tokens"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "leases",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("worker_id", sa.String(length=128), nullable=False),
        sa.Column("expires_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_leases")),
    )
    op.create_index("ix_leases_worker_id", "leases", ["worker_id"])
    op.add_column("batch_requests", sa.Column("lease_id", sa.String(length=32), nullable=True))
    op.create_index("ix_batch_requests_lease_id", "batch_requests", ["lease_id"])
    bind = op.get_bind()
    owners = bind.execute(
        sa.text(
            "SELECT lease_owner, max(coalesce(lease_expires_at, 0)) FROM batch_requests"
            " WHERE status = 'running' AND lease_owner IS NOT NULL GROUP BY lease_owner"
        )
    ).all()
    for owner, expires in owners:
        lease_id = f"lease_{uuid.uuid4().hex[:24]}"
        bind.execute(
            sa.text("INSERT INTO leases (id, worker_id, expires_at) VALUES (:i, :w, :e)"),
            {"i": lease_id, "w": owner, "e": expires},
        )
        bind.execute(
            sa.text("UPDATE batch_requests SET lease_id = :i WHERE status = 'running' AND lease_owner = :w"),
            {"i": lease_id, "w": owner},
        )
    op.drop_index("ix_batch_requests_lease", table_name="batch_requests")
    # The urgent claim reads its rows in EDF order off this index instead of sorting every urgent row.
    op.drop_index("ix_batch_requests_queue", table_name="batch_requests")
    op.create_index(
        "ix_batch_requests_queue",
        "batch_requests",
        ["model", "status", "deadline", "prefix_key", "batch_id", "line"],
    )
    # Plain ALTER TABLE on SQLite too (as 0019, 0021): a batch-mode copy of batch_requests would drop the table.
    op.drop_column("batch_requests", "lease_expires_at")


def downgrade() -> None:
    op.drop_index("ix_batch_requests_queue", table_name="batch_requests")
    op.create_index("ix_batch_requests_queue", "batch_requests", ["model", "status", "deadline"])
    op.add_column("batch_requests", sa.Column("lease_expires_at", sa.Float(), nullable=True))
    op.execute(
        "UPDATE batch_requests SET lease_expires_at ="
        " (SELECT l.expires_at FROM leases l WHERE l.id = batch_requests.lease_id) WHERE status = 'running'"
    )
    op.create_index("ix_batch_requests_lease", "batch_requests", ["status", "lease_expires_at"])
    op.drop_index("ix_batch_requests_lease_id", table_name="batch_requests")
    op.drop_column("batch_requests", "lease_id")
    op.drop_index("ix_leases_worker_id", table_name="leases")
    op.drop_table("leases")
