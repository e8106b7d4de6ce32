"""cost accounting indexes: batch_requests by finished_at, and a covering index for run attribution

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29 11:10:00.000000

`ix_batch_requests_run_usage` replaces `ix_batch_requests_run_id` (its first column is run_id, so it
serves every lookup the old one did).
"""

from __future__ import annotations

from alembic import op


revision = '0002'
down_revision = '0001'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('batch_requests', schema=None) as batch_op:
        batch_op.drop_index('ix_batch_requests_run_id')
        batch_op.create_index('ix_batch_requests_finished_at', ['finished_at'], unique=False)
        batch_op.create_index(
            'ix_batch_requests_run_usage',
            ['run_id', 'status', 'batch_id', 'prompt_tokens', 'completion_tokens'],
            unique=False,
        )


def downgrade() -> None:
    with op.batch_alter_table('batch_requests', schema=None) as batch_op:
        batch_op.drop_index('ix_batch_requests_run_usage')
        batch_op.drop_index('ix_batch_requests_finished_at')
        batch_op.create_index('ix_batch_requests_run_id', ['run_id'], unique=False)
