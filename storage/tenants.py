"""Tenants and their API keys; only a key's SHA-256 is stored."""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session

from storage.clock import now
from storage.errors import ApiKeyNotFound, InvalidRequest, TenantNotFound, Unauthorized
from storage.ids import new_id
from storage.models import ApiKey, Tenant


@dataclass(frozen=True)
class Principal:
    """Who is calling: the tenant every query is scoped to, and whether the key is an admin key."""

    tenant_id: str
    is_admin: bool


def hash_key(key: str) -> str:
    """SHA-256 of an API key (keys are random, so a slow hash adds nothing)."""
    return hashlib.sha256(key.encode()).hexdigest()


def get_or_create_tenant(session: Session, *, name: str) -> Tenant:
    """The tenant called `name`, created if new."""
    tenant = session.scalar(select(Tenant).where(Tenant.name == name))
    if tenant is None:
        tenant = Tenant(id=new_id("tenant_"), name=name, created_at=now())
        session.add(tenant)
        session.flush()
    return tenant


def tenant_name(session: Session, *, tenant_id: str) -> str | None:
    """The tenant's name (None if no such tenant)."""
    tenant = session.get(Tenant, tenant_id)
    return tenant.name if tenant is not None else None


def tenant_names(session: Session) -> dict[str, str]:
    """Every tenant's name by id (reports label rows with them)."""
    return {tenant_id: name for tenant_id, name in session.execute(select(Tenant.id, Tenant.name)).tuples()}


def tenant_id_named(session: Session, *, name: str) -> str | None:
    """The id of the tenant called `name`, if any."""
    return session.scalar(select(Tenant.id).where(Tenant.name == name))


def find_tenant(session: Session, *, tenant: str, param: str = "tenant") -> str:
    """The id of the tenant named `tenant` or with that id (an admin may write either); TenantNotFound (404)."""
    found = session.scalar(select(Tenant.id).where((Tenant.name == tenant) | (Tenant.id == tenant)))
    if found is None:
        raise TenantNotFound(f"No tenant named '{tenant[:200]}' (or with that id).", param=param)
    return found


def tenant_of_key(session: Session, *, key_hash: str) -> str | None:
    """The tenant of the live API key with this SHA-256 (api/fair_share.py counts requests by it), or None."""
    return session.scalar(select(ApiKey.tenant_id).where(ApiKey.key_hash == key_hash, ApiKey.revoked_at.is_(None)))


def any_api_key(session: Session) -> bool:
    """True once any API key exists (the embedded first run creates one)."""
    return session.scalar(select(ApiKey.id).limit(1)) is not None


def create_api_key(session: Session, *, tenant_name: str, is_admin: bool = False) -> str:
    """Create a key for the tenant and return it; it is never shown again."""
    tenant = get_or_create_tenant(session, name=tenant_name)
    key = "sk-bf-" + secrets.token_urlsafe(32)
    session.add(
        ApiKey(id=new_id("key_"), tenant_id=tenant.id, key_hash=hash_key(key), is_admin=is_admin, created_at=now())
    )
    session.flush()
    return key


def revoke_api_keys(
    session: Session, *, key: str | None = None, key_id: str | None = None, tenant: str | None = None
) -> list[str]:
    """Revoke the live key given by exactly one of its secret, its id (`key_…`) or its tenant's name (every key
    of that tenant); return the ids revoked, or ApiKeyNotFound. The next request with one answers 401."""
    if sum(selector is not None for selector in (key, key_id, tenant)) != 1:
        raise InvalidRequest("Name exactly one of 'key', 'key_id' or 'tenant'.", param="key")
    query = select(ApiKey).where(ApiKey.revoked_at.is_(None))
    if key is not None:
        query = query.where(ApiKey.key_hash == hash_key(key))
    elif key_id is not None:
        query = query.where(ApiKey.id == key_id)
    else:
        query = query.join(Tenant, Tenant.id == ApiKey.tenant_id).where(Tenant.name == tenant)
    rows = list(session.scalars(query.with_for_update()))
    if not rows:
        raise ApiKeyNotFound("There is no live key to revoke by that name (unknown, or revoked already).")
    for row in rows:
        row.revoked_at = now()
    session.flush()
    return [row.id for row in rows]


def authenticate(session: Session, *, key: str) -> Principal:
    """The principal for a bearer key, or Unauthorized."""
    row = session.scalar(select(ApiKey).where(ApiKey.key_hash == hash_key(key), ApiKey.revoked_at.is_(None)))
    if row is None:
        raise Unauthorized("Incorrect API key provided.")
    return Principal(tenant_id=row.tenant_id, is_admin=row.is_admin)


def first_tenants(session: Session, *, limit: int) -> dict[str, str]:
    """The `limit` oldest tenants' names by id: a stable set (metrics label these; the rest share one label)."""
    rows = session.execute(select(Tenant.id, Tenant.name).order_by(Tenant.created_at, Tenant.id).limit(limit))
    return {tenant_id: name for tenant_id, name in rows.tuples()}
