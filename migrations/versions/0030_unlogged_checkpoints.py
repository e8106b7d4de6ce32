"""unlogged checkpoints: a checkpoint writes no queue row and no WAL (issue 41)

Revision ID: 0030_unlogged_checkpoints
Revises: 0029_model_backlogs
Create Date: 2026-12-05 06:00:00.000000

A checkpoint write moved `batch_requests.checkpoint_tokens` (a new version of a wide row, often a full-page image)
and inserted chunks whose foreign key check locked that row (another WAL record): about 4.3 KB of WAL per write
beyond the token ids, which once lease renewals stopped rewriting every running row was most of what long
outputs wrote. The count moves to `checkpoints` (request id -> the claim whose generation appends, how many ids
the chunks hold), which writers serialize on instead of the queue row; `checkpoint_chunks` loses its foreign
key. On Postgres both are UNLOGGED: their writes make no WAL, and a database crash or failover empties them, so
the claims after it start those generations from token 0 (work decoded again, no answer lost). Rows running or
holding a checkpoint at the upgrade get their `checkpoints` row, under the claim they run under. Downgrading
puts the counts back on the rows.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0030_unlogged_checkpoints"
down_revision = "0029_model_backlogs"
branch_labels = None
depends_on = None

FK = "fk_checkpoint_chunks_request_id_batch_requests"


def upgrade() -> None:
    postgres = op.get_context().dialect.name == "postgresql"
    op.create_table(
        "checkpoints",
        sa.Column("request_id", sa.String(length=64), nullable=False),
        sa.Column("claim_id", sa.String(length=32), nullable=False, server_default=""),
        sa.Column("tokens", sa.Integer(), nullable=False, server_default="0"),
        sa.PrimaryKeyConstraint("request_id", name=op.f("pk_checkpoints")),
        prefixes=["UNLOGGED"] if postgres else [],
    )
    op.execute(
        "INSERT INTO checkpoints (request_id, claim_id, tokens) SELECT id, COALESCE(claim_id, ''), checkpoint_tokens"
        " FROM batch_requests WHERE status = 'running' OR (status = 'queued' AND checkpoint_tokens > 0)"
    )
    op.execute("DELETE FROM checkpoint_chunks WHERE request_id NOT IN (SELECT request_id FROM checkpoints)")
    with op.batch_alter_table("checkpoint_chunks") as batch_op:
        batch_op.drop_constraint(FK, type_="foreignkey")
    if postgres:
        op.execute("ALTER TABLE checkpoint_chunks SET UNLOGGED")
    op.drop_column("batch_requests", "checkpoint_tokens")


def downgrade() -> None:
    postgres = op.get_context().dialect.name == "postgresql"
    op.add_column("batch_requests", sa.Column("checkpoint_tokens", sa.Integer(), nullable=False, server_default="0"))
    op.execute(
        "UPDATE batch_requests SET checkpoint_tokens = (SELECT tokens FROM checkpoints c WHERE c.request_id ="
        " batch_requests.id) WHERE id IN (SELECT request_id FROM checkpoints)"
    )
    if postgres:
        op.execute("ALTER TABLE checkpoint_chunks SET LOGGED")
    op.execute("DELETE FROM checkpoint_chunks WHERE request_id NOT IN (SELECT id FROM batch_requests)")
    with op.batch_alter_table("checkpoint_chunks") as batch_op:
        batch_op.create_foreign_key(FK, "batch_requests", ["request_id"], ["id"], ondelete="CASCADE")
    op.drop_table("checkpoints")
