"""The framework's schema, evolved by the Alembic migrations shipped in `migrations/`.

    mega db upgrade      apply what is missing (mega dev and compose run it before the hosts)
    mega db current      the revision a database is at, and the newest one

`create_all` never alters a table that exists, so the framework's tables are never made with it:
each change is a numbered migration. A database made before migrations existed (its tables
created by `create_all`, no version recorded) is stamped at 0001 and upgraded from there, so
its users and sessions stay. On PostgreSQL an upgrade holds an advisory lock, so replicas that
start together apply each migration once.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import Connection, inspect, text

from mega.database import Database

if TYPE_CHECKING:
    from alembic.config import Config as AlembicConfig

# Our Alembic history's own version table (an application's keeps `alembic_version`).
VERSION_TABLE = "mega_alembic_version"
MIGRATIONS = Path(__file__).with_name("migrations")
# The revision whose tables databases made before migrations already have.
BASELINE = "0001"
BASELINE_TABLE = "mega_users"
# pg_advisory_lock key: "mega" in ASCII.
ADVISORY_LOCK_KEY = 0x6D656761
# The newest revision in migrations/versions (a test checks it is Alembic's head). A host whose
# database is there already reads one row and never imports Alembic (~12 MB, ~0.15 s).
HEAD = "0009"


def is_current(db: Database) -> bool:
    """True when the database is at HEAD: one query, no Alembic."""
    with db.engine.connect() as connection:
        if not inspect(connection).has_table(VERSION_TABLE):
            return False
        found = connection.execute(text(f"SELECT version_num FROM {VERSION_TABLE}")).scalars()
        return list(found) == [HEAD]


def upgrade(db: Database) -> tuple[str | None, str]:
    """Bring the database to the newest revision; returns (revision before, revision after)."""
    from alembic import command

    with db.engine.begin() as connection:
        if connection.dialect.name == "postgresql":
            connection.execute(
                text("SELECT pg_advisory_xact_lock(:key)"), {"key": ADVISORY_LOCK_KEY}
            )
        before = _current(connection)
        config = _config(connection)
        if before is None and inspect(connection).has_table(BASELINE_TABLE):
            command.stamp(config, BASELINE)  # made by create_all before migrations existed
        command.upgrade(config, "head")
        return before, _current(connection) or ""


def current(db: Database) -> str | None:
    """The revision the database is at (None: no framework table yet)."""
    with db.engine.connect() as connection:
        return _current(connection)


def head() -> str:
    """The newest revision this version of mega ships (Alembic's own count)."""
    from alembic.script import ScriptDirectory

    revision = ScriptDirectory.from_config(_config(None)).get_current_head()
    assert revision is not None
    return revision


def _current(connection: Connection) -> str | None:
    from alembic.runtime.migration import MigrationContext

    context = MigrationContext.configure(connection, opts={"version_table": VERSION_TABLE})
    return context.get_current_revision()


def _config(connection: Connection | None) -> AlembicConfig:
    from alembic.config import Config as AlembicConfig

    config = AlembicConfig()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.attributes["connection"] = connection
    return config
