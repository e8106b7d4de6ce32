"""The caller on Anthropic's routes: `x-api-key` (as Anthropic's SDK sends it) or a Bearer token."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Header

from api.deps import DbSession
from storage.errors import Unauthorized
from storage.tenants import Principal, authenticate


def _principal(
    session: DbSession,
    x_api_key: Annotated[str | None, Header()] = None,
    authorization: Annotated[str | None, Header()] = None,
) -> Principal:
    key = (x_api_key or "").strip()
    if not key and authorization and authorization.lower().startswith("bearer "):
        key = authorization[7:].strip()
    if not key:
        raise Unauthorized("x-api-key header is required")
    return authenticate(session, key=key)


Caller = Annotated[Principal, Depends(_principal)]


principal_dependency = _principal  # api/errors.py documents 401 on every route that depends on it
