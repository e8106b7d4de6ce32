"""bounded ingest retries: batches.ingest_attempts and batches.ingest_retry_at

Revision ID: 0007_hostile
Revises: 0011_metrics
Create Date: 2026-12-10 09:00:00.000000

An ingest that fails with an error no line explains (an unreadable object, a database error) is counted
on its batch and retried after a back-off; after `BACKFILL_INGEST_MAX_ATTEMPTS` the batch fails with
`ingest_failed` instead of being retried forever (issue 14).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op


revision = "0007_hostile"
down_revision = "0011_metrics"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("batches", schema=None) as batch_op:
        batch_op.add_column(sa.Column("ingest_attempts", sa.Integer(), server_default="0", nullable=False))
        batch_op.add_column(sa.Column("ingest_retry_at", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("batches", schema=None) as batch_op:
        batch_op.drop_column("ingest_retry_at")
        batch_op.drop_column("ingest_attempts")
