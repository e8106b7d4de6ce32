"""queue index sizes: the queue index carries each row's size, so a model's backlog is summed off it (issue 41)

Revision ID: 0028_queue_index_sizes
Revises: 0027_draws
Create Date: 2026-12-04 23:45:00.000000

Every worker process sums its model's open backlog (count, estimated input and maximum output tokens of the queued
and running rows) every 15 s for its urgency horizon (storage/queue/claim_order.py). That sum read the rows
themselves, bodies and all: 0.4 s at 300,000 queued rows (bench/fleet.py). `ix_batch_requests_queue` (model,
status, ...) already has an entry for each of those rows; on Postgres it now carries `est_input_tokens` and
`max_output_tokens` too (INCLUDE), so the sum is an index-only scan. No new index: a row written costs the same
number of index entries as before, each 8 bytes wider. SQLite has no INCLUDE; its index is unchanged. The new
index is built concurrently beside the old one, so upgrading a live queue blocks none of its writes.
"""

from __future__ import annotations

from alembic import op

revision = "0028_queue_index_sizes"
down_revision = "0027_draws"
branch_labels = None
depends_on = None

COLUMNS = ["model", "status", "deadline", "prefix_key", "batch_id", "line"]


def upgrade() -> None:
    _rebuild(include=["est_input_tokens", "max_output_tokens"])


def downgrade() -> None:
    _rebuild(include=[])


def _rebuild(*, include: list[str]) -> None:
    """The queue index again, built beside the old one without blocking the queue's writes (CONCURRENTLY, outside
    the migration's transaction), then swapped in under its name: an upgrade on a live queue stalls no worker."""
    if op.get_context().dialect.name != "postgresql":
        return
    with op.get_context().autocommit_block():
        op.execute("DROP INDEX CONCURRENTLY IF EXISTS ix_batch_requests_queue_new")  # a build an earlier try left
        op.create_index(
            "ix_batch_requests_queue_new",
            "batch_requests",
            COLUMNS,
            postgresql_include=include,
            postgresql_concurrently=True,
        )
        op.drop_index("ix_batch_requests_queue", table_name="batch_requests", postgresql_concurrently=True)
        op.execute("ALTER INDEX ix_batch_requests_queue_new RENAME TO ix_batch_requests_queue")
