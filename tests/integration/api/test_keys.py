"""Revoking an API key: by the operator's `backfill keys revoke` or an admin key's route; it answers 401 at once."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from tests.conftest import Backend, LiveServer, make_key, start_server
from worker.cli.main import main


@pytest.fixture
def api(backend: Backend) -> Iterator[LiveServer]:
    server, stop = start_server(with_worker=False)
    yield server
    stop()


def status(api: LiveServer, key: str) -> int:
    return httpx.get(f"{api.base_url}/v1/batches", headers={"Authorization": f"Bearer {key}"}).status_code


def test_backfill_keys_revoke_locks_the_key_out_at_once(api: LiveServer, capsys: pytest.CaptureFixture[str]) -> None:
    leaked, other = make_key("acme"), make_key("acme")
    assert status(api, leaked) == 200
    assert main(["keys", "revoke", "--key", leaked]) == 0
    assert "revoked 1 key" in capsys.readouterr().out
    assert status(api, leaked) == 401 and status(api, other) == 200
    assert main(["keys", "revoke", "--key", leaked]) == 1  # already revoked: nothing left to revoke
    assert "no live key" in capsys.readouterr().err

    assert main(["keys", "revoke", "--tenant", "acme"]) == 0  # every key of a tenant that left
    assert status(api, other) == 401


def test_an_admin_key_revokes_a_key_over_http_and_a_tenant_key_may_not(api: LiveServer) -> None:
    admin, leaked, bystander = make_key("ops", admin=True), make_key("acme"), make_key("beta")
    url = f"{api.base_url}/v1/organization/api_keys/revoke"
    refused = httpx.post(url, json={"key": bystander}, headers={"Authorization": f"Bearer {leaked}"})
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "permission_denied"
    assert status(api, bystander) == 200

    done = httpx.post(url, json={"key": leaked}, headers={"Authorization": f"Bearer {admin}"})
    assert done.status_code == 200, done.text
    body = done.json()
    assert body["object"] == "organization.api_keys.revoked" and len(body["revoked"]) == 1
    assert body["revoked"][0].startswith("key_")
    assert status(api, leaked) == 401 and status(api, bystander) == 200

    again = httpx.post(url, json={"key": leaked}, headers={"Authorization": f"Bearer {admin}"})
    assert again.status_code == 404 and again.json()["error"]["code"] == "api_key_not_found"
    vague = httpx.post(url, json={}, headers={"Authorization": f"Bearer {admin}"})
    assert vague.status_code == 400 and "exactly one" in vague.json()["error"]["message"]
    by_tenant = httpx.post(url, json={"tenant": "beta"}, headers={"Authorization": f"Bearer {admin}"})
    assert by_tenant.status_code == 200 and status(api, bystander) == 401
