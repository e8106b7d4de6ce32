"""Anthropic Message Batches: a protocol per batch, archival and deletion stamps

Revision ID: 0006_anthropic
Revises: 0004_openai_fields
Create Date: 2026-12-10 09:00:00.000000

`batches.protocol` says which API created a batch ("openai" or "anthropic"); every existing batch is an
OpenAI one. `archived_at` is set when an Anthropic batch's results pass their retention and are removed;
`deleted_at` when its owner deletes it (the row stays for cost accounting, its content is scrubbed).
`request_cancelled` / `request_expired` count the failed requests that were cancelled or expired, so
Anthropic's `request_counts` come from the batch row alone (no Anthropic batch predates this revision; the
OpenAI API does not read them).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op


revision = "0006_anthropic"
down_revision = "0004_openai_fields"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("batches", schema=None) as batch_op:
        batch_op.add_column(sa.Column("protocol", sa.String(length=16), server_default="openai", nullable=False))
        batch_op.add_column(sa.Column("archived_at", sa.BigInteger(), nullable=True))
        batch_op.add_column(sa.Column("deleted_at", sa.BigInteger(), nullable=True))
        batch_op.add_column(sa.Column("request_cancelled", sa.Integer(), server_default="0", nullable=False))
        batch_op.add_column(sa.Column("request_expired", sa.Integer(), server_default="0", nullable=False))


def downgrade() -> None:
    with op.batch_alter_table("batches", schema=None) as batch_op:
        batch_op.drop_column("request_expired")
        batch_op.drop_column("request_cancelled")
        batch_op.drop_column("deleted_at")
        batch_op.drop_column("archived_at")
        batch_op.drop_column("protocol")
