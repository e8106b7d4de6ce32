"""reasoning tokens: of a request's completion tokens, those spent thinking (OpenAI's reasoning_tokens)

Revision ID: 0021_reasoning_tokens
Revises: 0020_uploads
Create Date: 2026-12-05 12:00:00.000000

`batch_requests.reasoning_tokens` (0 for every existing row: no model thought before this revision) is summed
into a batch's `usage.output_tokens_details.reasoning_tokens`. They are billed as output tokens, which they
already are (completion_tokens counts them). Downgrading drops the column.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0021_reasoning_tokens"
down_revision = "0020_uploads"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("batch_requests", sa.Column("reasoning_tokens", sa.Integer(), server_default="0", nullable=False))


def downgrade() -> None:
    # Plain ALTER TABLE on SQLite too (as 0019): a batch-mode copy of batch_requests would drop the table it copies.
    op.drop_column("batch_requests", "reasoning_tokens")
