"""The SQL database: a SQLAlchemy engine and the declarative `Base` every table derives from.

SQLite under ./var/ by default, PostgreSQL by `DATABASE_URL=postgresql://...` (psycopg), in UTF8:
a PostgreSQL database in another encoding is refused on its first connection, in a sentence that
says how to create one (DatabaseEncodingError).
SQLAlchemy is used synchronously; async callers go through `run()`, which moves the call to a
worker thread so the event loop never waits on disk or network I/O.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import anyio.to_thread
from sqlalchemy import Engine, create_engine, event, text
from sqlalchemy.engine import make_url
from sqlalchemy.orm import DeclarativeBase, Session, sessionmaker

from mega.errors import DatabaseEncodingError

T = TypeVar("T")

# The only server encoding mega accepts on PostgreSQL. SQL_ASCII stores bytes unchecked (ordering,
# lower() and ILIKE see bytes, not letters) and LATIN1 and the like cannot store most scripts.
REQUIRED_ENCODING = "UTF8"


def as_utc(value: datetime) -> datetime:
    """A datetime read back from a table, aware: SQLite hands them back naive, and every value
    the framework's tables hold is UTC."""
    return value if value.tzinfo else value.replace(tzinfo=UTC)


class Base(DeclarativeBase):
    """Declarative base of the framework's tables (created by the migrations of
    mega/runtime/migrations, never by `create_all`). Applications keep their own base."""


class Database:
    def __init__(self, url: str) -> None:
        """The engine and the session factory (`sessions`) of one database; nothing connects
        yet, and a PostgreSQL database's encoding is checked on its first connection.

        Args:
            url: a SQLAlchemy URL, or `postgresql://` / `postgres://` for psycopg; a SQLite
                file's folder is made when missing.
        """
        self.url = _normalise(url)
        parsed = make_url(self.url)
        sqlite = parsed.get_backend_name() == "sqlite"
        postgresql = parsed.get_backend_name() == "postgresql"
        if sqlite and parsed.database not in (None, "", ":memory:"):
            Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
        # psycopg returns bytes, not str, for text when the client encoding is SQL_ASCII (the
        # default on a SQL_ASCII database, or PGCLIENTENCODING): every connection speaks UTF8.
        connect_args = {"client_encoding": REQUIRED_ENCODING} if postgresql else {}
        self.engine: Engine = create_engine(self.url, pool_pre_ping=True, connect_args=connect_args)
        if sqlite:
            event.listen(self.engine, "connect", _sqlite_pragmas)
        if postgresql:
            # Once per pool, before anything else reads or writes: every host and `mega db`
            # open the database here, so each refuses a wrong encoding with the same sentence.
            event.listen(self.engine, "first_connect", _require_utf8)
        self.sessions = sessionmaker(self.engine, expire_on_commit=False)

    @property
    def redacted_url(self) -> str:
        """The URL with its password hidden, for log lines and messages."""
        return make_url(self.url).render_as_string(hide_password=True)

    def ping(self) -> None:
        with self.engine.connect() as conn:
            conn.execute(text("SELECT 1"))

    async def run(self, fn: Callable[[Session], T]) -> T:
        """Run `fn(session)` in a thread inside one transaction, and return what it returns.

        Args:
            fn: a plain function of one Session; the transaction commits when it returns, and
                rolls back when it raises (the error comes back here).
        """

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


def encoding_refusal(database: str, encoding: str) -> str:
    """The sentence that refuses a database in `encoding`: what is wrong and the fix."""
    name = database if re.fullmatch(r"[a-z_][a-z0-9_]*", database) else _quoted(database)
    return (
        f"the database {database} uses the encoding {encoding}; mega needs {REQUIRED_ENCODING}: "
        f"create it with CREATE DATABASE {name} ENCODING '{REQUIRED_ENCODING}' TEMPLATE template0"
    )


def _quoted(identifier: str) -> str:
    return '"' + identifier.replace('"', '""') + '"'


def _require_utf8(dbapi_conn: Any, _record: object) -> None:
    cursor = dbapi_conn.cursor()
    try:
        cursor.execute("SELECT current_setting('server_encoding'), current_database()")
        encoding, database = cursor.fetchone()
    finally:
        cursor.close()
        dbapi_conn.rollback()  # the SELECT opened a transaction; the pool hands out none
    if encoding != REQUIRED_ENCODING:
        dbapi_conn.close()  # SQLAlchemy 2.1 closes it too; 2.0 would leave it to the GC
        raise DatabaseEncodingError(encoding_refusal(database, encoding))


def _sqlite_pragmas(dbapi_conn: object, _record: object) -> None:
    cursor = dbapi_conn.cursor()  # type: ignore[attr-defined]
    cursor.execute("PRAGMA journal_mode=WAL")  # readers do not block the writer
    cursor.execute("PRAGMA busy_timeout=5000")
    cursor.execute("PRAGMA synchronous=NORMAL")  # with WAL: no fsync per commit, still safe
    cursor.close()
