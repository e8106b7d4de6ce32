"""workflow: trial runs and checked answers (issue 40, sections 1 and 2)

Revision ID: 0024_workflow
Revises: 0022_leases
Create Date: 2026-12-04 18:00:00.000000

`batches.trial` (the trial's spec, its report once run) and `batches.trial_status` (running while only trial
lines may be claimed, then completed); `batches.checks` (what each answer must pass, storage/batches/checks.py).
`batch_requests.trial` marks the lines the trial runs; `batch_requests.check_attempts` holds a checked line's
attempts (how many, which check failed each time). Every column is empty (false) for existing rows: no batch
before this revision had a trial or checks. Downgrading drops them.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0024_workflow"
down_revision = "0023_adapters"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("batches", sa.Column("trial", sa.JSON(), nullable=True))
    op.add_column("batches", sa.Column("trial_status", sa.String(16), nullable=True))
    op.add_column("batches", sa.Column("checks", sa.JSON(), nullable=True))
    op.add_column("batch_requests", sa.Column("trial", sa.Boolean(), server_default=sa.false(), nullable=False))
    op.add_column("batch_requests", sa.Column("check_attempts", sa.JSON(), nullable=True))


def downgrade() -> None:
    # Plain ALTER TABLE on SQLite too (as 0019): a batch-mode copy of batch_requests would drop the table it copies.
    op.drop_column("batch_requests", "check_attempts")
    op.drop_column("batch_requests", "trial")
    op.drop_column("batches", "checks")
    op.drop_column("batches", "trial_status")
    op.drop_column("batches", "trial")
