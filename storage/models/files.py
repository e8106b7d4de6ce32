"""Files and Uploads (a file sent in parts)."""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
    false,
)
from sqlalchemy.orm import Mapped, mapped_column

from storage.models.base import Base


class File(Base):
    __tablename__ = "files"
    __table_args__ = (
        Index("ix_files_tenant_created", "tenant_id", "created_at"),
        Index("ix_files_expires_at", "expires_at"),  # the retention sweep reads the oldest expired first
    )

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    filename: Mapped[str] = mapped_column(String(512))
    purpose: Mapped[str] = mapped_column(String(32))
    bytes: Mapped[int] = mapped_column(BigInteger)
    blob_key: Mapped[str] = mapped_column(String(512))
    sha256: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[int] = mapped_column(BigInteger)
    deleted_at: Mapped[int | None] = mapped_column(BigInteger)
    expires_at: Mapped[int | None] = mapped_column(BigInteger)  # None: kept until deleted


class Upload(Base):
    """An Upload (OpenAI's Uploads API): a file sent in parts, assembled by the object store at complete
    (storage/files/uploads.py). `file_id` and `blob_key` are chosen at creation: the store's multipart upload
    is opened at that key, so completing it writes the file in place."""

    __tablename__ = "uploads"
    __table_args__ = (
        Index("ix_uploads_tenant_status", "tenant_id", "status"),  # quotas count the pending ones
        Index("ix_uploads_status_expires", "status", "expires_at"),  # the sweep: overdue and uncleared ones
    )

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    filename: Mapped[str] = mapped_column(String(512))
    purpose: Mapped[str] = mapped_column(String(32))
    mime_type: Mapped[str] = mapped_column(String(255))
    bytes: Mapped[int] = mapped_column(BigInteger)  # declared at creation; the listed parts must add up to it
    status: Mapped[str] = mapped_column(String(16))  # pending, completed, cancelled, expired
    created_at: Mapped[int] = mapped_column(BigInteger)
    expires_at: Mapped[int] = mapped_column(BigInteger)
    file_id: Mapped[str] = mapped_column(String(64))
    blob_key: Mapped[str] = mapped_column(String(512))
    store_upload_id: Mapped[str] = mapped_column(Text)  # S3's UploadId ("" on the local store)
    file_expires_after_seconds: Mapped[int | None] = mapped_column(Integer)
    parts_started: Mapped[int] = mapped_column(Integer, default=0, server_default="0")  # part numbers handed out
    # True once the store holds nothing of it but its completed file: parts aborted (cancel, expiry) or assembled.
    parts_cleared: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())


class UploadPart(Base):
    """One part of an Upload, stored by the object store under its part `number` (arrival order)."""

    __tablename__ = "upload_parts"
    __table_args__ = (UniqueConstraint("upload_id", "number"),)

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    upload_id: Mapped[str] = mapped_column(ForeignKey("uploads.id", ondelete="CASCADE"))
    number: Mapped[int] = mapped_column(Integer)
    bytes: Mapped[int] = mapped_column(BigInteger)
    etag: Mapped[str] = mapped_column(String(128))
    created_at: Mapped[int] = mapped_column(BigInteger)
