"""A PostgreSQL database that is not UTF8 is refused in one sentence, by `mega db upgrade` and by
every host, before anything is written; a UTF8 one is used whatever the client's encoding."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mega.database import encoding_refusal
from mega.drivers.embedded import free_port
from mega.runtime.bootstrap import check_database
from mega.runtime.migrate import HEAD

ROOT = Path(__file__).resolve().parents[3]


def mega(args: list[str], url: str, tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """`python -m mega ARGS --config CFG` on a config whose database is `url`, as a user runs it."""
    config = tmp_path / "cfg.py"
    config.write_text(f'services = {{"database": {{"url": "{url}"}}}}\n')
    environ = {**os.environ, "MEGA_SECRET_KEY": "k" * 40, **env}
    environ.pop("DATABASE_URL", None)
    return subprocess.run(
        [sys.executable, "-m", "mega", *args, "--config", str(config)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=environ,
        timeout=60,
    )


def refusal(url: str) -> str:
    name = url.rsplit("/", 1)[1]
    return (
        f"the database {name} uses the encoding SQL_ASCII; mega needs UTF8: "
        f"create it with CREATE DATABASE {name} ENCODING 'UTF8' TEMPLATE template0"
    )


def tables(url: str) -> list[str]:
    import psycopg

    with psycopg.connect(url, client_encoding="UTF8") as conn:
        rows = conn.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = 'public'"
        )
        return [row[0] for row in rows]


@pytest.mark.postgres
def test_mega_db_upgrade_refuses_a_sql_ascii_database_and_creates_nothing(
    sql_ascii_postgres_url: str, tmp_path: Path
) -> None:
    result = mega(["db", "upgrade"], sql_ascii_postgres_url, tmp_path)
    assert (result.returncode, result.stdout) == (1, "")
    assert result.stderr == f"mega db: error: {refusal(sql_ascii_postgres_url)}\n"
    assert tables(sql_ascii_postgres_url) == []


@pytest.mark.postgres
@pytest.mark.parametrize("host", ["start", "worker", "scheduler", "work"])
def test_every_host_refuses_a_sql_ascii_database_at_start(
    host: str, sql_ascii_postgres_url: str, tmp_path: Path
) -> None:
    args = [host, "--port", str(free_port())] if host == "start" else [host]
    result = mega(args, sql_ascii_postgres_url, tmp_path)
    assert (result.returncode, result.stdout) == (1, "")
    assert result.stderr == f"mega {host}: error: {refusal(sql_ascii_postgres_url)}\n"
    assert tables(sql_ascii_postgres_url) == []


@pytest.mark.postgres
def test_mega_dev_refuses_a_sql_ascii_database_before_starting_a_host(
    sql_ascii_postgres_url: str, tmp_path: Path, nats_url: str, redis_url: str
) -> None:
    services = {"NATS_URL": nats_url, "REDIS_URL": redis_url}  # no embedded servers to start
    result = mega(["dev", "--port", str(free_port())], sql_ascii_postgres_url, tmp_path, **services)
    assert (result.returncode, result.stderr) == (1, "")
    assert result.stdout == f"dev         | error: {refusal(sql_ascii_postgres_url)}\n"
    assert tables(sql_ascii_postgres_url) == []


@pytest.mark.postgres
def test_a_utf8_database_upgrades_even_when_the_client_asks_for_sql_ascii(
    postgres_url: str, tmp_path: Path
) -> None:
    # psycopg returns bytes for text when the client encoding is SQL_ASCII; mega asks for UTF8.
    result = mega(["db", "upgrade"], postgres_url, tmp_path, PGCLIENTENCODING="SQL_ASCII")
    assert result.returncode == 0, result.stderr
    assert result.stdout.endswith(f": upgraded from empty to {HEAD}\n")
    assert "mega_outbox" in tables(postgres_url)


async def test_a_lazy_host_leaves_a_database_that_does_not_answer_to_its_first_use(
    caplog: pytest.LogCaptureFixture,
) -> None:
    url = f"postgresql://postgres@127.0.0.1:{free_port()}/mega"
    with caplog.at_level(logging.WARNING, logger="mega.boot"):
        await check_database(url)  # returns: the worker starts, its relay waits for the database
    assert caplog.messages[-1].startswith(f"cannot open the database at {url[:10]}+psycopg")
    assert caplog.messages[-1].endswith("; its encoding is checked on first use")


@pytest.mark.parametrize(
    ("database", "command"),
    [
        ("mega", "CREATE DATABASE mega ENCODING 'UTF8' TEMPLATE template0"),
        ("mega_2", "CREATE DATABASE mega_2 ENCODING 'UTF8' TEMPLATE template0"),
        ("Mega-Prod", """CREATE DATABASE "Mega-Prod" ENCODING 'UTF8' TEMPLATE template0"""),
        ('a"b', """CREATE DATABASE "a""b" ENCODING 'UTF8' TEMPLATE template0"""),
    ],
)
def test_the_refusal_gives_a_command_that_runs_as_written(database: str, command: str) -> None:
    assert encoding_refusal(database, "LATIN1") == (
        f"the database {database} uses the encoding LATIN1; mega needs UTF8: create it with "
        + command
    )
