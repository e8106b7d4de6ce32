"""LoRA adapters registered through `POST /v1/adapters`."""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    ForeignKey,
    Integer,
    String,
    Text,
)
from sqlalchemy.orm import Mapped, mapped_column

from storage.models.base import Base


class Adapter(Base):
    """A LoRA adapter registered through `POST /v1/adapters` (storage/adapters/registry.py): a PEFT folder the
    engine of `base_model` loads; `tenant_id` set: only that tenant's lines may name it."""

    __tablename__ = "adapters"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    name: Mapped[str] = mapped_column(String(200), unique=True)
    base_model: Mapped[str] = mapped_column(String(200))
    tenant_id: Mapped[str | None] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"), index=True)
    path: Mapped[str] = mapped_column(Text)
    rank: Mapped[int] = mapped_column(Integer)
    size_bytes: Mapped[int] = mapped_column(BigInteger)
    target_modules: Mapped[list[Any]] = mapped_column(JSON)
    created_at: Mapped[int] = mapped_column(BigInteger)
