"""uploads: OpenAI's Uploads API (a file of up to 8 GB sent in parts)

Revision ID: 0020_uploads
Revises: 0019_retry_trees
Create Date: 2026-12-05 10:00:00.000000

`uploads`: one row per Upload (its declared size, status, the file id and object key chosen at creation, the
store's multipart upload id); `upload_parts`: one row per part the store holds, by its part number (arrival
order). Downgrading drops both tables; multipart uploads still open in the store are left to its lifecycle rule.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0020_uploads"
down_revision = "0019_retry_trees"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "uploads",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("tenant_id", sa.String(length=64), nullable=False),
        sa.Column("filename", sa.String(length=512), nullable=False),
        sa.Column("purpose", sa.String(length=32), nullable=False),
        sa.Column("mime_type", sa.String(length=255), nullable=False),
        sa.Column("bytes", sa.BigInteger(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("created_at", sa.BigInteger(), nullable=False),
        sa.Column("expires_at", sa.BigInteger(), nullable=False),
        sa.Column("file_id", sa.String(length=64), nullable=False),
        sa.Column("blob_key", sa.String(length=512), nullable=False),
        sa.Column("store_upload_id", sa.Text(), nullable=False),
        sa.Column("file_expires_after_seconds", sa.Integer(), nullable=True),
        sa.Column("parts_started", sa.Integer(), server_default="0", nullable=False),
        sa.Column("parts_cleared", sa.Boolean(), server_default=sa.false(), nullable=False),
        sa.ForeignKeyConstraint(
            ["tenant_id"], ["tenants.id"], name=op.f("fk_uploads_tenant_id_tenants"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_uploads")),
    )
    op.create_index("ix_uploads_tenant_status", "uploads", ["tenant_id", "status"])
    op.create_index("ix_uploads_status_expires", "uploads", ["status", "expires_at"])
    op.create_table(
        "upload_parts",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("upload_id", sa.String(length=64), nullable=False),
        sa.Column("number", sa.Integer(), nullable=False),
        sa.Column("bytes", sa.BigInteger(), nullable=False),
        sa.Column("etag", sa.String(length=128), nullable=False),
        sa.Column("created_at", sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(
            ["upload_id"], ["uploads.id"], name=op.f("fk_upload_parts_upload_id_uploads"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_upload_parts")),
        sa.UniqueConstraint("upload_id", "number", name=op.f("uq_upload_parts_upload_id")),
    )


def downgrade() -> None:
    op.drop_table("upload_parts")
    op.drop_index("ix_uploads_status_expires", table_name="uploads")
    op.drop_index("ix_uploads_tenant_status", table_name="uploads")
    op.drop_table("uploads")
