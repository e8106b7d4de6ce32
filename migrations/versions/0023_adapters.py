"""LoRA adapters: the registered adapters and the adapter each queued line names

Revision ID: 0023_adapters
Revises: 0022_leases
Create Date: 2026-12-04 17:20:00.000000

`adapters` holds what `POST /v1/adapters` registered (docs/adapters.md); adapters listed in the model registry
(settings) have no row. `batch_requests.adapter` (NULL for every existing row: the base model) is the adapter a
line named, so claims group by it, the engine loads it and costs are reported per adapter. Downgrading drops both.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0023_adapters"
down_revision = "0022_leases"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "adapters",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("base_model", sa.String(length=200), nullable=False),
        sa.Column("tenant_id", sa.String(length=64), nullable=True),
        sa.Column("path", sa.Text(), nullable=False),
        sa.Column("rank", sa.Integer(), nullable=False),
        sa.Column("size_bytes", sa.BigInteger(), nullable=False),
        sa.Column("target_modules", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(
            ["tenant_id"], ["tenants.id"], name=op.f("fk_adapters_tenant_id_tenants"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_adapters")),
        sa.UniqueConstraint("name", name=op.f("uq_adapters_name")),
    )
    op.create_index(op.f("ix_adapters_tenant_id"), "adapters", ["tenant_id"], unique=False)
    op.add_column("batch_requests", sa.Column("adapter", sa.String(length=200), nullable=True))


def downgrade() -> None:
    # Plain ALTER TABLE on SQLite too (as 0019): a batch-mode copy of batch_requests would drop the table it copies.
    op.drop_column("batch_requests", "adapter")
    op.drop_index(op.f("ix_adapters_tenant_id"), table_name="adapters")
    op.drop_table("adapters")
