"""predicted finish: admission's prediction kept on the batch (issue 40, section 3)

Revision ID: 0025_predicted_finish
Revises: 0024_workflow
Create Date: 2026-12-04 21:00:00.000000

`batches.predicted_finish_at`: when admission predicted, at ingest, that the batch would finish (unix seconds).
When the batch ends its actual finish is compared with it (the `backfill_batch_finish_error_seconds` histogram, the
console's operations page). Empty for existing rows: nothing was predicted for them, and nothing is compared.
Downgrading drops it.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0025_predicted_finish"
down_revision = "0024_workflow"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("batches", sa.Column("predicted_finish_at", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    # Plain ALTER TABLE on SQLite too (as 0019, 0024).
    op.drop_column("batches", "predicted_finish_at")
