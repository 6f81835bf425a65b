"""Real servers for the whole suite: one nats-server (JetStream) and one Redis-compatible server
per test session, on free ports. Tests isolate themselves with a unique prefix (`prefix`), and
tests that stop a server get their own through the `nats_factory` / `redis_factory` fixtures."""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from mega.runtime.embedded import EmbeddedNats, EmbeddedRedis, EmbeddedServer
from tests.cluster import NatsCluster


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Browser tests last: they are the slowest and need everything else to work first."""
    items.sort(key=lambda item: "/e2e/" in str(item.path))


@pytest.fixture(scope="session")
def nats_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedNats]:
    server = EmbeddedNats(data_dir=tmp_path_factory.mktemp("nats"))
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedRedis]:
    server = EmbeddedRedis(data_dir=tmp_path_factory.mktemp("redis"))
    server.start()
    yield server
    server.stop()


@pytest.fixture
def nats_url(nats_server: EmbeddedNats) -> str:
    return nats_server.url


@pytest.fixture
def redis_url(redis_server: EmbeddedRedis) -> str:
    return redis_server.url


@pytest.fixture
def prefix() -> str:
    """A unique name per test, for stream names, subjects and Redis keys."""
    return "t" + uuid.uuid4().hex[:10]


def _factory(kind: type[EmbeddedServer], tmp_path: Path) -> Iterator[Callable[[], EmbeddedServer]]:
    started: list[EmbeddedServer] = []

    def make() -> EmbeddedServer:
        server = kind(data_dir=tmp_path / f"{kind.__name__}-{len(started)}")
        started.append(server.start())
        return server

    yield make
    for server in started:
        server.stop()


@pytest.fixture
def nats_factory(tmp_path: Path) -> Iterator[Callable[[], EmbeddedServer]]:
    """Start a private nats-server the test may stop and restart (`.stop()`, `.start()`)."""
    yield from _factory(EmbeddedNats, tmp_path)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[NatsCluster]:
    """A real three-node NATS cluster of this test's own (tests/cluster.py)."""
    nodes = NatsCluster(tmp_path / "cluster").start()
    try:
        yield nodes
    finally:
        nodes.stop()


@pytest.fixture
def redis_factory(tmp_path: Path) -> Iterator[Callable[[], EmbeddedServer]]:
    """Start a private Redis the test may stop and restart (`.stop()`, `.start()`)."""
    yield from _factory(EmbeddedRedis, tmp_path)


ADMIN_URL = os.environ.get(
    "MEGA_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
)


@pytest.fixture
def postgres_url() -> Iterator[str]:
    """A fresh PostgreSQL database for one test (skips when no server answers)."""
    yield from _fresh_postgres_database()


@pytest.fixture
def sql_ascii_postgres_url() -> Iterator[str]:
    """A fresh PostgreSQL database in the SQL_ASCII encoding, which mega refuses."""
    yield from _fresh_postgres_database(
        "ENCODING 'SQL_ASCII' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0"
    )


def _fresh_postgres_database(options: str = "") -> Iterator[str]:
    """Create a database (with CREATE DATABASE `options`), yield its URL, drop it."""
    psycopg = pytest.importorskip("psycopg")
    try:
        admin = psycopg.connect(ADMIN_URL, autocommit=True, connect_timeout=2)
    except psycopg.OperationalError as exc:
        pytest.skip(f"no PostgreSQL at {ADMIN_URL}: {exc}")
    name = f"mega_test_{uuid.uuid4().hex[:10]}"
    admin.execute(f'CREATE DATABASE "{name}" {options}')
    try:
        yield ADMIN_URL.rsplit("/", 1)[0] + f"/{name}"
    finally:
        admin.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
        admin.close()
