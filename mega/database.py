"""The SQL database: a SQLAlchemy engine and the declarative `Base` every table derives from.

SQLite under ./var/ by default, PostgreSQL by `DATABASE_URL=postgresql://...` (psycopg).
SQLAlchemy is used synchronously; async callers go through `run()`, which moves the call to a
worker thread so the event loop never waits on disk or network I/O.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import anyio.to_thread
from sqlalchemy import Engine, create_engine, event, text
from sqlalchemy.engine import make_url
from sqlalchemy.orm import DeclarativeBase, Session, sessionmaker

T = TypeVar("T")


class Base(DeclarativeBase):
    """Declarative base of the framework's tables (created by the migrations of
    mega/runtime/migrations, never by `create_all`). Applications keep their own base."""


class Database:
    def __init__(self, url: str) -> None:
        self.url = _normalise(url)
        parsed = make_url(self.url)
        if parsed.drivername.startswith("sqlite") and parsed.database not in (None, "", ":memory:"):
            Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
        self.engine: Engine = create_engine(self.url, pool_pre_ping=True)
        if parsed.drivername.startswith("sqlite"):
            event.listen(self.engine, "connect", _sqlite_pragmas)
        self.sessions = sessionmaker(self.engine, expire_on_commit=False)

    @property
    def redacted_url(self) -> str:
        """The URL with its password hidden, for log lines and messages."""
        return make_url(self.url).render_as_string(hide_password=True)

    def ping(self) -> None:
        with self.engine.connect() as conn:
            conn.execute(text("SELECT 1"))

    async def run(self, fn: Callable[[Session], T]) -> T:
        """Run `fn(session)` in a thread inside one transaction (committed when fn returns)."""

        def call() -> T:
            with self.sessions.begin() as session:
                return fn(session)

        return await anyio.to_thread.run_sync(call)

    def dispose(self) -> None:
        self.engine.dispose()


def _normalise(url: str) -> str:
    # `postgresql://` in DATABASE_URL is the common spelling; SQLAlchemy needs the driver named.
    if url.startswith("postgresql://") or url.startswith("postgres://"):
        return "postgresql+psycopg://" + url.split("://", 1)[1]
    return url


def _sqlite_pragmas(dbapi_conn: object, _record: object) -> None:
    cursor = dbapi_conn.cursor()  # type: ignore[attr-defined]
    cursor.execute("PRAGMA journal_mode=WAL")  # readers do not block the writer
    cursor.execute("PRAGMA busy_timeout=5000")
    cursor.execute("PRAGMA synchronous=NORMAL")  # with WAL: no fsync per commit, still safe
    cursor.close()
