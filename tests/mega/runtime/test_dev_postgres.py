"""`mega dev` starts an embedded PostgreSQL when a bus is on PostgreSQL and DATABASE_URL is
unset, and hands its URL to the hosts (and to var/dev.env)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

from mega.drivers.embedded import free_port
from mega.runtime.dev import _write_dev_env, needs_postgres, start_dev_postgres
from tests.processes import alive, command_line

POSTGRES_BUS = """
services = {"buses": {"jobs": {"driver": "postgres"}, "other": {"driver": "nats"}}}
"""
NATS_BUS = """
services = {"buses": {"jobs": {"driver": "nats", "url": "nats://127.0.0.1:4222"}}}
"""


@pytest.mark.parametrize(
    ("services", "environ", "expected"),
    [
        ({"buses": {"jobs": {"driver": "postgres"}}}, {}, True),
        ({"buses": {"jobs": {"driver": "nats"}, "b": {"driver": "postgres"}}}, {}, True),
        ({"buses": {"jobs": {"driver": "nats"}}}, {}, False),
        ({"buses": {"jobs": {"driver": "redis"}}}, {"MEGA_BUS": "postgres"}, True),
        ({"buses": {"jobs": {"driver": "redis"}}}, {"MEGA_BUS": "redis"}, False),
        (None, {"MEGA_BUS": "postgres"}, True),
        ({}, {}, False),
        ({"buses": ["not", "a", "dict"]}, {}, False),
        ({"buses": {"jobs": "postgres"}}, {}, False),  # not a bus spec: validation says so
        ("services", {}, False),
    ],
)
def test_needs_postgres(services: object, environ: dict[str, str], expected: bool) -> None:
    assert needs_postgres(services, environ) is expected


def test_a_postgres_bus_gets_a_durable_embedded_postgres_under_var(postgres_dir: Path) -> None:
    config = postgres_dir / "mega_config.py"
    config.write_text(POSTGRES_BUS)
    env: dict[str, str] = {}
    server = start_dev_postgres(config, env)
    assert server is not None
    try:
        assert server.data_dir == postgres_dir / "var" / "postgres"
        assert env["DATABASE_URL"] == server.url
        with psycopg.connect(server.url, connect_timeout=5) as conn:
            assert conn.execute("show fsync").fetchone() == ("on",)  # durable: not fast
        dev_env = _write_dev_env(postgres_dir, {**env, "NATS_URL": "nats://127.0.0.1:4999"})
        assert dev_env.read_text() == (
            f"NATS_URL=nats://127.0.0.1:4999\nDATABASE_URL={server.url}\n"
        )
    finally:
        server.stop()
    assert server.process is not None and not alive(server.process.pid)


def test_no_postgres_when_database_url_is_set_or_no_bus_needs_it(tmp_path: Path) -> None:
    config = tmp_path / "mega_config.py"
    config.write_text(POSTGRES_BUS)
    env = {"DATABASE_URL": "postgresql://someone@db.example/app"}
    assert start_dev_postgres(config, env) is None
    assert env == {"DATABASE_URL": "postgresql://someone@db.example/app"}
    config.write_text(NATS_BUS)
    assert start_dev_postgres(config, {}) is None
    config.write_text("raise RuntimeError('load_config reports this one')\n")
    assert start_dev_postgres(config, {}) is None
    assert not (tmp_path / "var" / "postgres").exists()


def test_mega_dev_starts_it_hands_it_over_and_stops_it(
    postgres_dir: Path, nats_url: str, redis_url: str
) -> None:
    """A real `mega dev` whose config then fails validation: PostgreSQL was started first (the
    config reads DATABASE_URL), and is stopped with the rest."""
    config = postgres_dir / "mega_config.py"
    config.write_text(POSTGRES_BUS.replace("postgres", "memory") + "auth = {'bogus': 1}\n")
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    env.update(MEGA_BUS="postgres", NATS_URL=nats_url, REDIS_URL=redis_url, NO_COLOR="1")
    result = subprocess.run(
        [sys.executable, "-m", "mega", "dev", "--port", str(free_port()), "--config", str(config)],
        capture_output=True,
        text=True,
        cwd=postgres_dir,
        env=env,
        timeout=60,
    )
    lines = result.stdout.splitlines()
    assert result.returncode == 1, result.stdout + result.stderr
    assert re.fullmatch(
        r"dev +\| embedded PostgreSQL on postgresql://postgres@127\.0\.0\.1:\d+/postgres", lines[0]
    ), lines
    assert "auth.bogus: unknown key" in lines[1]
    assert lines[-1].endswith("| embedded servers stopped")
    assert (postgres_dir / "var" / "postgres" / "pgdata" / "PG_VERSION").exists()
    cluster = str(postgres_dir / "var" / "postgres" / "pgdata")
    assert not [pid for pid in all_pids() if alive(pid) and cluster in command_line(pid)]


def all_pids() -> list[int]:
    return [int(entry.name) for entry in Path("/proc").iterdir() if entry.name.isdigit()]
