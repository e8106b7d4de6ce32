"""The Alembic-migrated schema matches the ORM models, on SQLite and on Postgres."""

from __future__ import annotations

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext

from storage.db import get_engine
from storage.models import Base
from tests.conftest import Backend


def test_migrated_schema_matches_models(backend: Backend) -> None:
    with get_engine().connect() as connection:
        context = MigrationContext.configure(connection, opts={"compare_type": True})
        diff = compare_metadata(context, Base.metadata)
    assert diff == []
