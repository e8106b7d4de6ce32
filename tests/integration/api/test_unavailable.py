"""While Postgres cannot be reached, the API answers 503 with Retry-After (OpenAI's envelope), not a 500; the
official SDK's own retries then ride out a short outage. Found by `make chaos` (docs/chaos.md)."""

from __future__ import annotations

import httpx
import openai
import pytest
import sqlalchemy as sa

from tests.conftest import PG_ADMIN_URL, Backend, LiveServer, make_key


def _allow_connections(database: str, allowed: bool) -> None:
    admin = sa.create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(sa.text(f'ALTER DATABASE "{database}" ALLOW_CONNECTIONS {str(allowed).lower()}'))
        if not allowed:
            conn.execute(
                sa.text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = :db"), {"db": database}
            )
    admin.dispose()


def test_a_database_outage_answers_503_with_retry_after_and_recovers(backend: Backend, api: LiveServer) -> None:
    if backend.name != "postgres":
        pytest.skip("a database outage is simulated on Postgres")
    key = make_key("acme")
    headers = {"Authorization": f"Bearer {key}"}
    assert httpx.get(f"{api.base_url}/v1/batches", headers=headers).status_code == 200
    database = sa.engine.make_url(backend.env["BACKFILL_DATABASE_URL"]).database
    assert database
    _allow_connections(database, False)
    try:
        down = httpx.get(f"{api.base_url}/v1/batches", headers=headers)
        files = httpx.get(f"{api.base_url}/v1/files", headers=headers)
        with pytest.raises(openai.APIStatusError) as raised:  # the SDK as a client meets it (retries off here)
            api.client(key).batches.list()
    finally:
        _allow_connections(database, True)
    assert raised.value.status_code == 503 and raised.value.code == "service_unavailable"
    assert down.status_code == 503 and files.status_code == 503
    assert down.headers["Retry-After"] == "5"
    error = down.json()["error"]
    assert error["type"] == "server_error" and error["code"] == "service_unavailable"
    assert httpx.get(f"{api.base_url}/v1/batches", headers=headers).status_code == 200  # back once it is
