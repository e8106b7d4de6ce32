"""model backlogs: a model's open backlog summed once for the fleet, not once per worker process (issue 41)

Revision ID: 0029_model_backlogs
Revises: 0028_queue_index_sizes
Create Date: 2026-12-04 23:55:00.000000

`model_backlogs` keeps the last sum of each model's open requests (count, estimated input and maximum output
tokens, the LoRA overhead of its adapter lines) and when it was made; the claim that finds it older than the urgency horizon's age limit sums the queue
again (storage/queue/fleet_backlog.py). Empty at first: the first claim of each model sums it.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0029_model_backlogs"
down_revision = "0028_queue_index_sizes"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "model_backlogs",
        sa.Column("model", sa.String(200), nullable=False),
        sa.Column("requests", sa.BigInteger(), nullable=False),
        sa.Column("input_tokens", sa.BigInteger(), nullable=False),
        sa.Column("output_tokens", sa.BigInteger(), nullable=False),
        sa.Column("lora_work", sa.Float(), nullable=False),
        sa.Column("summed_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("model", name=op.f("pk_model_backlogs")),
    )


def downgrade() -> None:
    op.drop_table("model_backlogs")
