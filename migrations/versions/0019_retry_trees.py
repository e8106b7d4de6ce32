"""retry trees stored: a retry and the merged view cost what the failed lines cost, not the tree's size

Revision ID: 0019_retry_trees
Revises: 0018_checkpoint_chunks
Create Date: 2026-12-04 14:00:00.000000

A retry used to find its lines, and the merged view its rows, by walking every row of every batch of the tree
(17 s at 20 retries of a 5,000-line batch, under the database's write lock). Now:
- `batches.retry_root`: on every retry, the id of its tree's original batch (one indexed read finds a tree);
- `batch_requests.superseded`: a row a retry copied (a later attempt of its line exists); a line's rows that are
  not superseded are its latest attempt, so a retry reads only the latest failures through
  `ix_batch_requests_batch_status` (batch_id, status, superseded);
- `batch_requests.latest_copy`: on the original batch's row of a line, the id of its newest copy, so the merged
  view reads one row per line; `batch_requests.copy_of`: on a copy, the row it copied (the line's previous
  attempt, which the merged view shows while the copy runs).
Existing trees are filled in here (in Python, tree by tree: there are few). Downgrading drops the columns.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0019_retry_trees"
down_revision = "0018_checkpoint_chunks"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Plain ALTER TABLE on SQLite too (no batch-mode copy: dropping `batches` to rebuild it would cascade-delete
    # every queue row, foreign keys being on).
    op.add_column("batches", sa.Column("retry_root", sa.String(length=64), nullable=True))
    op.create_index("ix_batches_retry_root", "batches", ["retry_root"])
    op.add_column("batch_requests", sa.Column("superseded", sa.Boolean(), server_default=sa.false(), nullable=False))
    op.add_column("batch_requests", sa.Column("latest_copy", sa.String(length=64), nullable=True))
    op.add_column("batch_requests", sa.Column("copy_of", sa.String(length=64), nullable=True))
    op.drop_index("ix_batch_requests_batch_status", table_name="batch_requests")
    op.create_index("ix_batch_requests_batch_status", "batch_requests", ["batch_id", "status", "superseded"])
    _fill_existing_trees(op.get_bind())


def _fill_existing_trees(connection: sa.Connection) -> None:
    parents = dict(connection.execute(sa.text("SELECT id, retry_of FROM batches WHERE retry_of IS NOT NULL")).all())
    if not parents:
        return
    roots: dict[str, str] = {}
    for batch_id in parents:
        root = batch_id
        while root in parents:
            root = parents[root]
        roots[batch_id] = root
    set_root = sa.text("UPDATE batches SET retry_root = :root WHERE id = :id")
    connection.execute(set_root, [{"root": root, "id": batch_id} for batch_id, root in roots.items()])
    for root in sorted(set(roots.values())):
        members = [root, *(batch_id for batch_id, r in roots.items() if r == root)]
        rows = connection.execute(
            sa.text(
                "SELECT r.id, r.line, b.attempt, r.batch_id FROM batch_requests r JOIN batches b ON b.id = r.batch_id "
                "WHERE r.batch_id IN :members ORDER BY r.line, b.attempt"
            ).bindparams(sa.bindparam("members", expanding=True)),
            {"members": members},
        ).all()
        by_line: dict[int, list[tuple[str, str]]] = {}
        for row_id, line, _, batch_id in rows:
            by_line.setdefault(line, []).append((row_id, batch_id))
        superseded = [{"id": row_id} for attempts in by_line.values() for row_id, _ in attempts[:-1]]
        if superseded:
            connection.execute(sa.text("UPDATE batch_requests SET superseded = true WHERE id = :id"), superseded)
        latest = [
            {"id": attempts[0][0], "latest": attempts[-1][0]}
            for attempts in by_line.values()
            if len(attempts) > 1 and attempts[0][1] == root
        ]
        if latest:
            connection.execute(sa.text("UPDATE batch_requests SET latest_copy = :latest WHERE id = :id"), latest)
        copies = [
            {"id": attempts[i][0], "source": attempts[i - 1][0]}
            for attempts in by_line.values()
            for i in range(1, len(attempts))
        ]
        if copies:
            connection.execute(sa.text("UPDATE batch_requests SET copy_of = :source WHERE id = :id"), copies)


def downgrade() -> None:
    op.drop_index("ix_batch_requests_batch_status", table_name="batch_requests")
    op.create_index("ix_batch_requests_batch_status", "batch_requests", ["batch_id", "status"])
    op.drop_column("batch_requests", "copy_of")
    op.drop_column("batch_requests", "latest_copy")
    op.drop_column("batch_requests", "superseded")
    op.drop_index("ix_batches_retry_root", table_name="batches")
    op.drop_column("batches", "retry_root")
