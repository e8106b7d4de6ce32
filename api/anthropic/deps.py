"""The caller on Anthropic's routes: `x-api-key` (as Anthropic's SDK sends it) or a Bearer token, read as on every
route (api/deps.py); only the message of a missing key is Anthropic's."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Header

from api.deps import DbSession, api_key_of, caller_of
from storage.tenants import Principal


def _principal(
    session: DbSession,
    x_api_key: Annotated[str | None, Header()] = None,
    authorization: Annotated[str | None, Header()] = None,
) -> Principal:
    key = api_key_of(x_api_key=x_api_key, authorization=authorization)
    return caller_of(session, key=key, missing="x-api-key header is required")


Caller = Annotated[Principal, Depends(_principal)]


principal_dependency = _principal  # api/errors.py documents 401 on every route that depends on it
