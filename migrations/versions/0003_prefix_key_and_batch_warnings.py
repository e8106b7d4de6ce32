"""deadline-aware packing: prefix keys and sizes on batch_requests, admission warnings on batches

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01 09:00:00.000000

`batch_requests.prefix_key` groups requests sharing a prompt prefix in the claim order (index
`ix_batch_requests_prefix_queue`); `est_input_tokens` / `max_output_tokens` size each request once at
ingest so admission and estimates never parse bodies; `batches.warnings` carries admission warnings.
Requests still open at upgrade time are sized here from their stored bodies (ingest sizes the whole
line: a few dozen bytes more); they keep the empty prefix key (one group).
"""

from __future__ import annotations

import json

import sqlalchemy as sa
from alembic import op


revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

_DEFAULT_MAX_TOKENS = 256
_BYTES_PER_TOKEN = 4


def upgrade() -> None:
    with op.batch_alter_table("batch_requests", schema=None) as batch_op:
        batch_op.add_column(sa.Column("prefix_key", sa.String(length=32), server_default="", nullable=False))
        batch_op.add_column(sa.Column("est_input_tokens", sa.Integer(), server_default="0", nullable=False))
        batch_op.add_column(sa.Column("max_output_tokens", sa.Integer(), server_default="0", nullable=False))
        batch_op.create_index(
            "ix_batch_requests_prefix_queue",
            ["model", "status", "tenant_id", "prefix_key", "deadline", "batch_id", "line"],
            unique=False,
        )
    with op.batch_alter_table("batches", schema=None) as batch_op:
        batch_op.add_column(sa.Column("warnings", sa.JSON(), nullable=True))
    _size_open_requests()


def _size_open_requests() -> None:
    connection = op.get_bind()
    rows = connection.execute(
        sa.text("SELECT id, url, body FROM batch_requests WHERE status IN ('queued', 'running')")
    ).all()
    sizes = []
    for request_id, url, body in rows:
        text = body if isinstance(body, str) else json.dumps(body)
        parsed = json.loads(text) if isinstance(body, str) else body
        sizes.append({"id": request_id, "i": -(-len(text.encode()) // _BYTES_PER_TOKEN), "o": _output(url, parsed)})
    if sizes:
        connection.execute(
            sa.text("UPDATE batch_requests SET est_input_tokens = :i, max_output_tokens = :o WHERE id = :id"), sizes
        )


def _output(url: str, body: object) -> int:
    if url == "/v1/embeddings":
        return 0
    for name in ("max_completion_tokens", "max_tokens"):
        value = body.get(name) if isinstance(body, dict) else None
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return _DEFAULT_MAX_TOKENS


def downgrade() -> None:
    with op.batch_alter_table("batches", schema=None) as batch_op:
        batch_op.drop_column("warnings")
    with op.batch_alter_table("batch_requests", schema=None) as batch_op:
        batch_op.drop_index("ix_batch_requests_prefix_queue")
        batch_op.drop_column("max_output_tokens")
        batch_op.drop_column("est_input_tokens")
        batch_op.drop_column("prefix_key")
