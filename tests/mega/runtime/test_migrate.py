"""The framework's schema by migrations: an empty database, a database made by `create_all`
before migrations existed (users and sessions kept), and `mega db` from the command line."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import inspect, select, text

from mega.database import Base, Database
from mega.events.db_inbox import InboxRow
from mega.runtime.migrate import HEAD, _config, current, head, is_current, upgrade
from mega.transactional.store import OutboxRow
from mega.web.models import LoginFailure, User, UserSession
from mega.web.tokens import list_tokens

ROOT = Path(__file__).resolve().parents[3]


def legacy_database(url: str) -> Database:
    """A database as the web host made it before migrations: create_all of the login tables,
    with a user and a live session in them."""
    db = Database(url)
    tables = [User.__table__, UserSession.__table__, LoginFailure.__table__]
    made_later = [OutboxRow.__table__, InboxRow.__table__]
    Base.metadata.drop_all(db.engine, tables=[*made_later, *tables])  # type: ignore[list-item]
    Base.metadata.create_all(db.engine, tables=tables)  # type: ignore[arg-type]
    now = datetime.now(UTC)
    with db.sessions.begin() as session:
        user = User(username="ada", password_hash="scrypt$1$1$1$x$y", created_at=now)
        session.add(user)
        session.flush()
        session.add(
            UserSession(
                id_hash="h" * 64,
                user_id=user.id,
                csrf_token="t",
                created_at=now,
                expires_at=now + timedelta(hours=1),
            )
        )
    return db


def check_upgraded_keeps_rows(db: Database) -> None:
    assert current(db) is None  # no version recorded: made by create_all
    before, after = upgrade(db)
    assert (before, after) == (None, head())
    assert current(db) == head() == "0009"
    assert inspect(db.engine).has_table("mega_outbox")
    assert inspect(db.engine).has_table("mega_inbox")
    assert inspect(db.engine).has_table("mega_api_tokens")
    with db.sessions() as session:
        assert session.scalars(select(User.username)).all() == ["ada"]
        assert session.scalars(select(UserSession.id_hash)).all() == ["h" * 64]
    assert upgrade(db) == ("0009", "0009")  # idempotent


def test_the_fast_check_knows_alembics_head() -> None:
    assert head() == HEAD


def test_an_empty_sqlite_database_gets_every_table(tmp_path: Path) -> None:
    db = Database(f"sqlite:///{tmp_path / 'new.db'}")
    assert not is_current(db)
    assert upgrade(db) == (None, "0009")
    assert is_current(db)
    names = set(inspect(db.engine).get_table_names())
    assert {
        "mega_users",
        "mega_sessions",
        "mega_login_failures",
        "mega_outbox",
        "mega_inbox",
        "mega_api_tokens",
        "mega_audit",
    } <= names
    assert "mega_alembic_version" in names and "alembic_version" not in names
    db.dispose()


def test_a_token_made_before_scopes_keeps_every_scope_and_no_end(tmp_path: Path) -> None:
    """It could do everything: 0009 changes nothing of what it may do."""
    from alembic import command

    db = Database(f"sqlite:///{tmp_path / 'tokens.db'}")
    with db.engine.begin() as connection:
        command.upgrade(_config(connection), "0008")
        connection.execute(
            text(
                "INSERT INTO mega_api_tokens (name, token_hash, created_at) "
                "VALUES ('old-bot', :hash, :at)"
            ),
            {"hash": "h" * 64, "at": datetime.now(UTC).isoformat(" ")},  # as sqlite3 stored it
        )
    assert upgrade(db) == ("0008", head())
    with db.sessions() as session:
        [info] = list_tokens(session)
    assert (info.name, info.expires_at) == ("old-bot", None)
    assert info.scopes == "jobs:enqueue,console:read,console:operate,console:admin"
    db.dispose()


def test_a_sqlite_database_made_before_migrations_keeps_its_users(tmp_path: Path) -> None:
    db = legacy_database(f"sqlite:///{tmp_path / 'old.db'}")
    check_upgraded_keeps_rows(db)
    db.dispose()


@pytest.mark.postgres
def test_a_postgres_database_made_before_migrations_keeps_its_users(postgres_url: str) -> None:
    db = legacy_database(postgres_url)
    try:
        check_upgraded_keeps_rows(db)
    finally:
        db.dispose()


def test_mega_db_upgrade_and_current_from_the_command_line(tmp_path: Path) -> None:
    config = tmp_path / "cfg.py"
    config.write_text(f'services = {{"database": {{"url": "sqlite:///{tmp_path / "cli.db"}"}}}}\n')
    env = {**os.environ, "MEGA_SECRET_KEY": "k" * 40}
    env.pop("DATABASE_URL", None)

    def mega_db(action: str) -> str:
        result = subprocess.run(
            [sys.executable, "-m", "mega", "db", action, "--config", str(config)],
            capture_output=True,
            text=True,
            cwd=ROOT,
            env=env,
            timeout=60,
        )
        assert result.returncode == 0, result.stderr
        return result.stdout.strip()

    assert mega_db("current").endswith("at nothing (empty); newest 0009")
    assert mega_db("upgrade").endswith("upgraded from empty to 0009")
    assert mega_db("upgrade").endswith("already at 0009")
    assert mega_db("current").endswith("at 0009; newest 0009")
