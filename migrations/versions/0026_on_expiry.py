"""on_expiry: what becomes of a batch's unfinished lines when its window closes (issue 40, section 4)

Revision ID: 0026_on_expiry
Revises: 0025_predicted_finish
Create Date: 2026-12-04 20:30:00.000000

`batches.on_expiry`: null (the lines still generating end with what they generated so far, the rest as
`batch_expired`) or `continue_in_background` (they carry on from their checkpoints in a child batch of the
background tier, docs/workflow.md). Null for every existing batch: the behaviour they were created under.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0026_on_expiry"
down_revision = "0025_predicted_finish"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("batches", sa.Column("on_expiry", sa.String(32), nullable=True))


def downgrade() -> None:
    op.drop_column("batches", "on_expiry")
