"""Request dependencies: one session per request (committed before the response), the caller's tenant."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated

from fastapi import Depends, Header
from sqlalchemy.orm import Session

from storage.blobs import BlobStore, get_blob_store
from storage.db import transaction
from storage.errors import Unauthorized
from storage.settings import Settings, get_settings
from storage.tenants import Principal, authenticate


def _session() -> Iterator[Session]:
    with transaction() as session:
        yield session


# scope="function": commit happens before the response is sent, so a client never reads stale state.
DbSession = Annotated[Session, Depends(_session, scope="function")]


def _principal(session: DbSession, authorization: Annotated[str | None, Header()] = None) -> Principal:
    if not authorization or not authorization.lower().startswith("bearer "):
        raise Unauthorized("You didn't provide an API key. Send it in the Authorization header as 'Bearer YOUR_KEY'.")
    return authenticate(session, key=authorization[7:].strip())


def release_connection(session: Session) -> None:
    """End the request's read-only part (the key check) before slow work, so no connection or snapshot is
    held while a body streams to object storage; the session opens a short write transaction after it."""
    session.commit()


principal_dependency = _principal  # api/errors.py documents 401 on every route that depends on it
Caller = Annotated[Principal, Depends(_principal)]
Blobs = Annotated[BlobStore, Depends(get_blob_store)]
Config = Annotated[Settings, Depends(get_settings)]
