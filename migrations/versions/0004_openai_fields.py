"""OpenAI's newer batch fields: cached prompt tokens per request, file expiry, output file expiry per batch

Revision ID: 0004_openai_fields
Revises: 0007_hostile
Create Date: 2026-12-01 12:00:00.000000

`batch_requests.cached_tokens` holds the prompt tokens the engine served from its prefix cache (the batch's
`usage.input_tokens_details.cached_tokens`, priced at the cached-input rate); `files.expires_at` (indexed
for the retention sweep) and `batches.output_expires_after_seconds` carry OpenAI's `expires_after` and
`output_expires_after`. Files uploaded before this revision keep `expires_at` NULL: they never expire.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op


revision = "0004_openai_fields"
down_revision = "0007_hostile"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("batch_requests", schema=None) as batch_op:
        batch_op.add_column(sa.Column("cached_tokens", sa.Integer(), server_default="0", nullable=False))
    with op.batch_alter_table("files", schema=None) as batch_op:
        batch_op.add_column(sa.Column("expires_at", sa.BigInteger(), nullable=True))
        batch_op.create_index("ix_files_expires_at", ["expires_at"], unique=False)
    with op.batch_alter_table("batches", schema=None) as batch_op:
        batch_op.add_column(sa.Column("output_expires_after_seconds", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("batches", schema=None) as batch_op:
        batch_op.drop_column("output_expires_after_seconds")
    with op.batch_alter_table("files", schema=None) as batch_op:
        batch_op.drop_index("ix_files_expires_at")
        batch_op.drop_column("expires_at")
    with op.batch_alter_table("batch_requests", schema=None) as batch_op:
        batch_op.drop_column("cached_tokens")
