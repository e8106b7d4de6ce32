"""Engine and session factory; sessions open at the boundary (API dependency, task wrapper)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from functools import lru_cache

import orjson
from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import ExceptionContext
from sqlalchemy.orm import Session, sessionmaker

from storage.metrics.events import count_database_error
from storage.settings import get_settings


def _sqlite_pragmas(dbapi_connection, _record) -> None:  # type: ignore[no-untyped-def]
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute("PRAGMA busy_timeout=30000")
    cursor.close()


def _json(value: object) -> str:
    return orjson.dumps(value).decode()


def _count_error(context: ExceptionContext) -> None:
    error = context.sqlalchemy_exception
    count_database_error(type(error).__name__ if error is not None else "other")


# Connections beyond the API's request threads: the embedded worker, wake-ups, the reaper.
_WORKER_CONNECTIONS = 8


def make_engine(url: str, *, threads: int = 40, echo: bool = False) -> Engine:
    """Create a SQLAlchemy engine; SQLite gets WAL and a busy timeout for the in-process worker.

    JSON columns (request and response bodies) go through orjson: ingest and results write megabytes.
    The pool holds a connection for every request thread (`threads`) plus the worker's, so a burst of
    clients waits on the database, never on the pool. SQL is never logged unless `echo` (it carries
    tenant ids and key hashes).
    """
    if url.startswith("sqlite"):
        in_memory = url in ("sqlite://", "sqlite:///:memory:")  # one connection per thread: no pool to size
        pool = {} if in_memory else {"pool_size": threads + _WORKER_CONNECTIONS, "max_overflow": _WORKER_CONNECTIONS}
        engine = create_engine(
            url,
            connect_args={"check_same_thread": False, "timeout": 30},
            json_serializer=_json,
            json_deserializer=orjson.loads,
            echo=echo,
            **pool,
        )
        event.listen(engine, "connect", _sqlite_pragmas)
        return engine
    return create_engine(
        url,
        pool_pre_ping=True,
        pool_size=10,  # kept open; up to threads + worker more while busy (Postgres' default allows 100)
        max_overflow=threads + _WORKER_CONNECTIONS - 10 if threads + _WORKER_CONNECTIONS > 10 else 0,
        json_serializer=_json,
        json_deserializer=orjson.loads,
        echo=echo,
    )


@lru_cache(maxsize=1)
def get_engine() -> Engine:
    """The process-wide engine for the configured database."""
    settings = get_settings()
    if settings.database_url is None:
        settings.data_dir.mkdir(parents=True, exist_ok=True)
    engine = make_engine(settings.sqlalchemy_url, threads=settings.api_threads, echo=settings.sql_echo)
    event.listen(engine, "handle_error", _count_error)  # backfill_database_errors_total
    return engine


@lru_cache(maxsize=1)
def get_sessionmaker() -> sessionmaker[Session]:
    """Sessions never expire loaded objects on commit."""
    return sessionmaker(bind=get_engine(), expire_on_commit=False)


@contextmanager
def transaction() -> Iterator[Session]:
    """One unit of work: commit on success, roll back on error."""
    session = get_sessionmaker()()
    try:
        yield session
        session.commit()
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()
