"""results layout: the manifest key of a batch

Revision ID: 0011_metrics
Revises: 0012_queue_body_lz4
Create Date: 2026-12-10 09:00:00.000000

`batches.manifest_key` names the batch's manifest.json in object storage (storage/batches/manifests.py). Batches
that ended before it existed keep NULL: they have no manifest, and their files keep their own keys.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011_metrics"
down_revision = "0012_queue_body_lz4"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("batches", schema=None) as batch_op:
        batch_op.add_column(sa.Column("manifest_key", sa.String(length=512), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("batches", schema=None) as batch_op:
        batch_op.drop_column("manifest_key")
