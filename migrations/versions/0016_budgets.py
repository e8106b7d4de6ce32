"""spend caps: a batch's max_cost_usd and a tenant's monthly budget, both in exact micro-dollars

Revision ID: 0016_budgets
Revises: 0013_liveness
Create Date: 2026-12-01 19:30:00.000000

Money is stored as integer micro-dollars (exact on every database; storage/finance/budgets.py turns it into
Decimal). A batch over its cap, or of a tenant over its month's budget, stops claiming (docs/finance.md).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0016_budgets"
down_revision = "0015_batch_control"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("batches", sa.Column("max_cost_micro_usd", sa.BigInteger(), nullable=True))
    op.add_column("tenants", sa.Column("monthly_budget_micro_usd", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    op.drop_column("tenants", "monthly_budget_micro_usd")
    op.drop_column("batches", "max_cost_micro_usd")
