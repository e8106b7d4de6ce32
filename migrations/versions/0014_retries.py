"""retries and results while a batch runs

Revision ID: 0014_retries
Revises: 0013_liveness
Create Date: 2026-12-01 19:30:00.000000

`batches.retry_of` links a retry (a batch re-running the failed requests of an ended one) to its origin;
`batches.attempt` orders the batches of one retry tree (0 the original, n the nth retry created in it).
`batch_requests.result_seq` numbers a batch's finished requests in the order a results reader first saw them
(storage/queue/result_rows.py), so `GET /v1/batches/{id}/results?after=` returns each line once.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0014_retries"
down_revision = "0013_liveness"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("batches", schema=None) as batch_op:
        batch_op.add_column(sa.Column("retry_of", sa.String(length=64), nullable=True))
        batch_op.add_column(sa.Column("attempt", sa.Integer(), server_default="0", nullable=False))
    op.create_index("ix_batches_retry_of", "batches", ["retry_of"])
    with op.batch_alter_table("batch_requests", schema=None) as batch_op:
        batch_op.add_column(sa.Column("result_seq", sa.BigInteger(), nullable=True))
    # Results pages walk a batch by sequence (results while it runs) or by line (the merged view of retries).
    op.create_index("ix_batch_requests_batch_result_seq", "batch_requests", ["batch_id", "result_seq"])
    op.create_index("ix_batch_requests_batch_line", "batch_requests", ["batch_id", "line"])


def downgrade() -> None:
    op.drop_index("ix_batch_requests_batch_line", table_name="batch_requests")
    op.drop_index("ix_batch_requests_batch_result_seq", table_name="batch_requests")
    with op.batch_alter_table("batch_requests", schema=None) as batch_op:
        batch_op.drop_column("result_seq")
    op.drop_index("ix_batches_retry_of", table_name="batches")
    with op.batch_alter_table("batches", schema=None) as batch_op:
        batch_op.drop_column("attempt")
        batch_op.drop_column("retry_of")
