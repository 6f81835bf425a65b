"""Real servers for the whole suite: one nats-server (JetStream), one Redis-compatible server,
one PostgreSQL and, for the tests that ask, one Redis Cluster per test session, on free ports.
Tests isolate themselves with a unique prefix (`prefix`) or, on PostgreSQL, a database of their
own (`postgres_url`), and tests that stop a server get their own through the `nats_factory` /
`redis_factory` / `postgres_factory` fixtures."""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from mega.drivers.embedded import EmbeddedServer
from mega.drivers.nats.embedded import EmbeddedNats
from mega.drivers.postgres.embedded import EmbeddedPostgres
from mega.drivers.redis.embedded import EmbeddedRedis, EmbeddedRedisCluster
from tests.cluster import NatsCluster
from tests.netns import NamespacesUnavailable, NetnsCluster, Network

# Tests that share something beyond the session's servers run on one xdist worker each group
# (`make test` runs three, `--dist loadgroup`): the compose tests share the Docker daemon, and
# the tests that restart worker processes in a loop the cores (two of them at once starve each
# other's workers of the CPU their boots take). The browser tests need no group: each xdist
# worker starts live stacks of its own (a session fixture), and they run on each at the end.
XDIST_GROUPS = {
    "/ops/test_compose": "compose",
    "/events/test_inbox_faults": "restart_loops",
    "/jobs/test_workflow_faults": "restart_loops",
    "/jobs/test_redis_failover": "restart_loops",
    # the silent-fault scenarios measure seconds: two clusters at once skew each other's
    "/jobs/test_silent_faults": "silent_faults",
}


# `make check` runs what needs no server process of its own (`-m "not server"`); the tests
# these find are marked `server` and left to `make test`. The session's NATS and Redis, started
# once, are no test's own: a config on the memory driver still names them.
SERVER_MARKS = {"slow", "e2e", "compose", "postgres"}
SERVER_FIXTURES = {
    *("nats_factory", "redis_factory", "postgres_factory", "postgres_server", "postgres_url"),
    *("sql_ascii_postgres_url", "cluster", "netns_cluster", "redis_cluster", "redis_cluster_url"),
    *("live_stack", "browser", "page"),
}
DRIVER_PARAMS = {"nats", "redis", "redis-cluster", "postgres"}  # the contract suites' drivers
# Modules whose tests start hosts (`mega worker`, `uvicorn`, the guide's shell blocks) or
# servers of their own (sentinels, replicas, a PostgreSQL) as processes.
SERVER_MODULES = (
    "/docs/test_guide_commands.py",
    "/runtime/test_cli.py",
    "/runtime/test_lost_connection.py",
    "/runtime/test_embedded_postgres.py",
    "/runtime/test_dev_postgres.py",
    "/drivers/redis/test_sentinel.py",
    "/drivers/redis/test_durable.py",
    "/app/test_asgi.py",
)


def needs_a_server(item: pytest.Item) -> bool:
    """Whether `item` starts a server or a host process of its own, or runs on a server driver."""
    if any(item.get_closest_marker(name) for name in SERVER_MARKS):
        return True
    if SERVER_FIXTURES & set(getattr(item, "fixturenames", ())):
        return True
    callspec = getattr(item, "callspec", None)
    params = callspec.params.values() if callspec is not None else ()
    if any(isinstance(value, str) and value in DRIVER_PARAMS for value in params):
        return True
    return any(module in str(item.path) for module in SERVER_MODULES)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Marks the `server` tests; browser tests last: they are the slowest and need everything
    else to work first."""
    for item in items:
        if needs_a_server(item):
            item.add_marker(pytest.mark.server)
    items.sort(key=lambda item: "/e2e/" in str(item.path))


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """`--dist loadgroup` by XDIST_GROUPS, read off each test's path. The `xdist_group` mark
    is not used: xdist names a test's group by appending it to the test's node id, which
    pytest 9.2's structured node ids ignore, so marked tests were spread as if unmarked
    (pytest-dev/pytest-xdist#1386). The groups keep the tests' order (no reordering by size):
    each group runs where its first test is, and the browser tests last."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadGroupScheduling

    class PathGroups(LoadGroupScheduling):  # type: ignore[misc]  # xdist ships no types: Any
        def _split_scope(self, nodeid: str) -> str:
            path = "/" + nodeid.split("::", 1)[0]
            groups = [group for part, group in XDIST_GROUPS.items() if part in path]
            return groups[0] if groups else nodeid

    config.option.loadscopereorder = False
    return PathGroups(config, log)


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


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedRedisCluster]:
    """A Redis Cluster for the session: 3 masters with a replica each (its nodes are
    `redis_cluster.nodes`; `kill_master()` crashes one)."""
    cluster = EmbeddedRedisCluster(data_dir=tmp_path_factory.mktemp("redis-cluster"))
    cluster.start()
    yield cluster
    cluster.stop()


@pytest.fixture
def redis_cluster_url(redis_cluster: EmbeddedRedisCluster) -> str:
    return redis_cluster.url


@contextlib.contextmanager
def _outside_pytest_temp(name: str) -> Iterator[Path]:
    """A folder for a PostgreSQL data dir in the system temp dir, removed after. Not under
    pytest's temp root: under root, PostgreSQL runs as an unprivileged user who must traverse
    the folders above its data, and every pytest session that starts (several run at once on
    one machine) strips /tmp/pytest-of-root back to 0700."""
    folder = Path(tempfile.mkdtemp(prefix=f"mega-test-{name}-"))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[EmbeddedPostgres]:
    """PostgreSQL for the session, in fast mode (no fsync: nothing here must survive a crash)."""
    with _outside_pytest_temp("postgres") as folder:
        server = EmbeddedPostgres(data_dir=folder, fast=True)
        server.start()
        yield server
        server.stop()


@pytest.fixture
def postgres_dir() -> Iterator[Path]:
    """An empty folder for a test's own PostgreSQL data (see `_outside_pytest_temp`)."""
    with _outside_pytest_temp("postgres") as folder:
        yield folder


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
def netns_cluster(tmp_path: Path) -> Iterator[NetnsCluster]:
    """A three-node NATS cluster in network namespaces of this test's own (tests/netns.py),
    which it may cut off or freeze; skipped where namespaces cannot be made."""
    try:
        network = Network().create()
    except NamespacesUnavailable as exc:
        pytest.skip(str(exc))
    nodes = NetnsCluster(tmp_path / "cluster", network)
    try:
        nodes.start()
        yield nodes
    finally:
        nodes.stop()
        network.destroy()


@pytest.fixture
def redis_factory(tmp_path: Path) -> Iterator[Callable[[], EmbeddedServer]]:
    """Start a private Redis the test may stop and restart (`.stop()`, `.start()`)."""
    yield from _factory(EmbeddedRedis, tmp_path)


@pytest.fixture
def postgres_factory(postgres_dir: Path) -> Iterator[Callable[[], EmbeddedPostgres]]:
    """Start a private PostgreSQL (fast mode) the test may stop and restart (`.stop()`,
    `.kill()`, `.start()`)."""
    started: list[EmbeddedPostgres] = []

    def make() -> EmbeddedPostgres:
        server = EmbeddedPostgres(data_dir=postgres_dir / f"postgres-{len(started)}", fast=True)
        started.append(server.start())
        return server

    yield make
    for server in started:
        server.stop()


@pytest.fixture
def postgres_url(postgres_server: EmbeddedPostgres) -> Iterator[str]:
    """A fresh PostgreSQL database (UTF8) on the session's server for one test, dropped after."""
    yield from _fresh_postgres_database(postgres_server.url)


@pytest.fixture
def sql_ascii_postgres_url(postgres_server: EmbeddedPostgres) -> Iterator[str]:
    """A fresh PostgreSQL database in the SQL_ASCII encoding, which mega refuses."""
    yield from _fresh_postgres_database(
        postgres_server.url, "ENCODING 'SQL_ASCII' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0"
    )


def _fresh_postgres_database(admin_url: str, options: str = "") -> Iterator[str]:
    """Create a database (with CREATE DATABASE `options`), yield its URL, drop it."""
    import psycopg

    name = f"mega_test_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(admin_url, autocommit=True, connect_timeout=5) as admin:
        admin.execute(f'CREATE DATABASE "{name}" {options}')
    try:
        yield admin_url.rsplit("/", 1)[0] + f"/{name}"
    finally:
        with psycopg.connect(admin_url, autocommit=True, connect_timeout=5) as admin:
            admin.execute(f'DROP DATABASE "{name}" WITH (FORCE)')


@pytest.fixture
def spans() -> Iterator[Any]:
    """An OpenTelemetry SDK set up for this test, its spans kept in memory
    (`spans.get_finished_spans()`); afterwards no SDK again: the other tests run untraced."""
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    try:
        yield exporter
    finally:
        provider.shutdown()
        # The API lets a provider be set once per process; a test's must not outlive it.
        trace._TRACER_PROVIDER = None  # type: ignore[attr-defined]
        trace._TRACER_PROVIDER_SET_ONCE._done = False  # type: ignore[attr-defined]
