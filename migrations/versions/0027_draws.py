"""draws: the failed draws a checked line made so far, kept with its queue row (issue 40, section 2)

Revision ID: 0027_draws
Revises: 0026_on_expiry
Create Date: 2026-12-05 00:00:00.000000

`batch_requests.draws`: while a checked line is open, the draws it made that failed its checks (which check each
failed, and their usage), written by its worker at each redraw, so a line handed back between draws (a pause, a
drain, a lost lease) goes on with its next draw on its next claim instead of drawing them all again
(storage/queue/draws.py). Null for every existing row: no draw of it is on record, as before.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0027_draws"
down_revision = "0026_on_expiry"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("batch_requests", sa.Column("draws", sa.JSON(), nullable=True))


def downgrade() -> None:
    # Plain ALTER TABLE on SQLite too (as 0024): a batch-mode copy of batch_requests would drop the table it copies.
    op.drop_column("batch_requests", "draws")
