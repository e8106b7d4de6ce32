"""`POST /v1/organization/api_keys/revoke`: an admin key revokes a leaked or departed tenant's keys over HTTP.

The same as `backfill keys revoke` on the server (storage/tenants.py); the next request with a revoked key
answers 401, since every request looks its key up.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field

from api.deps import Caller, DbSession
from api.errors import error_responses
from storage.errors import PermissionDenied
from storage.tenants import revoke_api_keys

router = APIRouter(prefix="/v1/organization/api_keys", tags=["organization"], responses=error_responses(403))


class KeyRevoke(BaseModel):
    """Exactly one of: the key itself, its id, or a tenant's name (every live key of that tenant)."""

    model_config = ConfigDict(extra="forbid")

    key: str | None = Field(default=None, max_length=256)
    key_id: str | None = Field(default=None, max_length=64)
    tenant: str | None = Field(default=None, max_length=256)


@router.post("/revoke", response_model=dict[str, Any], responses=error_responses(404))
def revoke(body: KeyRevoke, session: DbSession, caller: Caller) -> dict[str, Any]:
    """Admin keys only: revoke API keys; they answer 401 from the next request on."""
    if not caller.is_admin:
        raise PermissionDenied("Only admin keys may revoke API keys.")
    revoked = revoke_api_keys(session, key=body.key, key_id=body.key_id, tenant=body.tenant)
    return {"object": "organization.api_keys.revoked", "revoked": revoked}
