"""Request dependencies: one session per request (committed before the response), the caller's tenant."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Header, Query
from fastapi.routing import APIRoute
from sqlalchemy.orm import Session

from storage.db import transaction
from storage.errors import Unauthorized
from storage.files.blobs import BlobStore, get_blob_store
from storage.settings import Settings, get_settings
from storage.tenants import Principal, authenticate


def _session() -> Iterator[Session]:
    with transaction() as session:
        yield session


# scope="function": commit happens before the response is sent, so a client never reads stale state.
DbSession = Annotated[Session, Depends(_session, scope="function")]


def api_key_of(*, x_api_key: str | None, authorization: str | None) -> str | None:
    """The API key a request carries: `x-api-key` or `Authorization: Bearer` (the SDKs send one or the other), on
    every route, so a route serving both protocols' batches takes either (api/fair_share.py reads it too)."""
    key = (x_api_key or "").strip()
    if not key and authorization and authorization[:7].lower() == "bearer ":
        key = authorization[7:].strip()
    return key or None


def caller_of(session: Session, *, key: str | None, missing: str) -> Principal:
    """The principal of `key` (Unauthorized with `missing` when there is none); the key check is a read, so the
    connection goes back to the pool while the route waits for a thread."""
    if key is None:
        raise Unauthorized(missing)
    principal = authenticate(session, key=key)
    session.commit()
    return principal


def _principal(
    session: DbSession,
    authorization: Annotated[str | None, Header()] = None,
    x_api_key: Annotated[str | None, Header(include_in_schema=False)] = None,  # OpenAI's routes document Bearer
) -> Principal:
    key = api_key_of(x_api_key=x_api_key, authorization=authorization)
    missing = "You didn't provide an API key. Send it in the Authorization header as 'Bearer YOUR_KEY'."
    return caller_of(session, key=key, missing=missing)


def commit_in_route_threads(app: FastAPI) -> None:
    """Commit each sync route's session in the route's own thread, before FastAPI serializes the answer.

    FastAPI validates a sync route's response on another pool thread, after the route returned but before
    a `yield` dependency's exit runs. A transaction still open there holds SQLite's write lock (or Postgres
    row locks) while it waits for a free thread, and the threads are all taken by requests waiting for that
    lock: every write stalls until the busy timeout (the "database is locked" 500s under 50 clients). With
    the commit here, no request holds a lock or a connection while it waits for a thread; the session
    dependency's exit still rolls back on an error (and commits whatever a route did after this point).
    """
    for route in app.routes:
        sync = isinstance(route, APIRoute) and route.dependant.call and not route.dependant.is_coroutine_callable
        if sync and isinstance(route, APIRoute) and route.dependant.call is not None:
            route.dependant.call = _committing(route.dependant.call)


def _committing(endpoint: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(endpoint)
    def call(**values: Any) -> Any:
        result = endpoint(**values)
        for value in values.values():
            if isinstance(value, Session):
                value.commit()
        return result

    return call


principal_dependency = _principal  # api/errors.py documents 401 on every route that depends on it
Caller = Annotated[Principal, Depends(_principal)]
Blobs = Annotated[BlobStore, Depends(get_blob_store)]
Config = Annotated[Settings, Depends(get_settings)]
# A paging cursor names an object id (at most ~40 characters): anything longer is a 400 that never echoes it.
Cursor = Annotated[str | None, Query(max_length=128, description="An object id from a previous page.")]
