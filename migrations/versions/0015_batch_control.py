"""batch control: pause/resume and priority of a batch

Revision ID: 0015_batch_control
Revises: 0013_liveness
Create Date: 2026-12-01 19:30:00.000000

`batches.paused_at` (set while paused: the claim skips the batch) and `batches.priority` (-100..100, higher
claims first among non-urgent work). Both are read from the small `batches` table by the claim, so nothing is
denormalised onto `batch_requests`. The background tier needs no column: its batches carry
`completion_window = 'background'` and a far-future `expires_at` (storage/batch_control.py).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op


revision = "0015_batch_control"
down_revision = "0014_retries"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("batches", sa.Column("paused_at", sa.BigInteger(), nullable=True))
    op.add_column("batches", sa.Column("priority", sa.Integer(), server_default="0", nullable=False))


def downgrade() -> None:
    op.drop_column("batches", "priority")
    op.drop_column("batches", "paused_at")
