"""append-only checkpoints: a row's generated token ids as chunks, each write adding only the new ones

Revision ID: 0018_checkpoint_chunks
Revises: 0017_checkpoints
Create Date: 2026-12-02 06:30:00.000000

`batch_requests.checkpoint` held the whole list and every write rewrote it, so a long generation's
checkpoints cost the square of its length in writes. `checkpoint_chunks` holds (request, start) -> the ids
generated from `start` on, packed as before (little-endian int32, zlib); a write inserts the tokens since the
row's `checkpoint_tokens` and moves that count in the same transaction (storage/queue/checkpoints.py), if
the row's `claim_id` (set by each claim) is still the one its generation started under. An existing
checkpoint becomes its row's chunk at 0 (same packing); a row claimed before the upgrade has no `claim_id`,
so its worker's later writes are refused (its generation still finishes and its result is recorded).
Downgrading drops the chunks and the counts: a row without a checkpoint restarts its generation, it does not
answer wrong.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0018_checkpoint_chunks"
down_revision = "0017_checkpoints"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "checkpoint_chunks",
        sa.Column("request_id", sa.String(length=64), nullable=False),
        sa.Column("start", sa.Integer(), nullable=False),
        sa.Column("token_ids", sa.LargeBinary(), nullable=False),
        sa.ForeignKeyConstraint(
            ["request_id"],
            ["batch_requests.id"],
            name=op.f("fk_checkpoint_chunks_request_id_batch_requests"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("request_id", "start", name=op.f("pk_checkpoint_chunks")),
    )
    op.execute(
        "INSERT INTO checkpoint_chunks (request_id, start, token_ids) SELECT id, 0, checkpoint FROM batch_requests"
        " WHERE checkpoint IS NOT NULL AND checkpoint_tokens > 0"
    )
    op.drop_column("batch_requests", "checkpoint")
    op.add_column("batch_requests", sa.Column("claim_id", sa.String(length=32), nullable=True))


def downgrade() -> None:
    op.drop_column("batch_requests", "claim_id")
    op.add_column("batch_requests", sa.Column("checkpoint", sa.LargeBinary(), nullable=True))
    op.execute("UPDATE batch_requests SET checkpoint_tokens = 0 WHERE checkpoint_tokens > 0")
    op.drop_table("checkpoint_chunks")
