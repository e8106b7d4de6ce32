"""generation checkpoints: a queue row keeps the token ids its request generated before it was handed back

Revision ID: 0017_checkpoints
Revises: 0016_budgets
Create Date: 2026-12-01 23:00:00.000000

`checkpoint` holds the generated token ids packed as little-endian int32 and zlib-compressed
(storage/queue/checkpoints.py); `checkpoint_tokens` is how many there are, so a write that would store fewer
tokens than the row already has is refused without unpacking. A claimed row with a checkpoint resumes from
it (docs/workers.md, "Checkpoints and resume").
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0017_checkpoints"
down_revision = "0016_budgets"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("batch_requests", sa.Column("checkpoint", sa.LargeBinary(), nullable=True))
    op.add_column("batch_requests", sa.Column("checkpoint_tokens", sa.Integer(), nullable=False, server_default="0"))


def downgrade() -> None:
    op.drop_column("batch_requests", "checkpoint_tokens")
    op.drop_column("batch_requests", "checkpoint")
