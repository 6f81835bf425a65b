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

from alembic import command
from alembic.config import Config as AlembicConfig
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, inspect, text

from mega.database import Database

# Our Alembic history's own version table (an application's keeps `alembic_version`).
VERSION_TABLE = "mega_alembic_version"
MIGRATIONS = Path(__file__).with_name("migrations")
# The revision whose tables databases made before migrations already have.
BASELINE = "0001"
BASELINE_TABLE = "mega_users"
# pg_advisory_lock key: "mega" in ASCII.
ADVISORY_LOCK_KEY = 0x6D656761


def upgrade(db: Database) -> tuple[str | None, str]:
    """Bring the database to the newest revision; returns (revision before, revision after)."""
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
    """The newest revision this version of mega ships."""
    revision = ScriptDirectory.from_config(_config(None)).get_current_head()
    assert revision is not None
    return revision


def _current(connection: Connection) -> str | None:
    context = MigrationContext.configure(connection, opts={"version_table": VERSION_TABLE})
    return context.get_current_revision()


def _config(connection: Connection | None) -> AlembicConfig:
    config = AlembicConfig()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.attributes["connection"] = connection
    return config
