"""A three-node NATS cluster in Linux network namespaces, for faults that look like silence:
a node's link set down (its packets vanish: no RST, no FIN) or its nats-server frozen (SIGSTOP).

    hub namespace      bridge br0, HUB_ADDRESS; the processes that use the cluster run here
    n1, n2, n3         one nats-server each on <SUBNET>.1..3, eth0 joined to br0 by a veth pair
                       whose other end (v1..v3) is in the hub

    network = Network().create()        # NamespacesUnavailable when they cannot be made
    cluster = NetnsCluster(tmp_path, network).start()
    cluster.hub.command(["python", ...])  # argv that runs inside the hub
    await cluster.hub.run(coroutine)      # a coroutine on a thread that joined the hub
    cluster.cut("n2"); cluster.heal("n2"); cluster.freeze("n2"); cluster.thaw("n2")
    cluster.stop(); network.destroy()    # every namespace goes, with its links

Nothing is configured in the host's own namespace: the links are made inside the namespaces,
and deleting a namespace deletes its end of every pair. Requires root and iproute2's `ip`.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import json
import os
import shutil
import signal
import subprocess
import time
import urllib.request
import uuid
from collections.abc import Callable, Coroutine, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from mega.drivers.embedded import port_open
from tests.cluster import ClusterNode, NatsCluster
from tests.processes import alive

# Every namespace of a run is named mega-<pid of the test process>-<run id>-<role>: the pid
# tells a leftover of a dead run (removed at the next start) from one of a run still going.
NAME_PREFIX = "mega-"
# The addresses exist only inside a run's namespaces, which have no route out: they cannot
# collide with the host's networks, nor with another run's (its own namespaces).
SUBNET = "10.254.93"
HUB_ADDRESS = f"{SUBNET}.254"
# Each node has an address of its own, so every node uses NATS's usual ports.
CLIENT_PORT, ROUTE_PORT, MONITOR_PORT = 4222, 6222, 8222
# Threads that joined the hub at once: an observer, an enqueuer, readiness probes.
HUB_THREADS = 4
CLONE_NEWNET = 0x40000000  # setns(2): join a network namespace

T = TypeVar("T")


class NamespacesUnavailable(Exception):
    """Network namespaces cannot be made here (not root, no `ip`, or `ip netns add` refused)."""


def _ip(*args: str) -> str:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout


def _join(name: str) -> None:
    """Move the calling thread into the namespace `name` (a network namespace is per thread)."""
    libc = ctypes.CDLL(None, use_errno=True)
    with open(f"/run/netns/{name}") as namespace:
        if libc.setns(namespace.fileno(), CLONE_NEWNET) != 0:
            error = ctypes.get_errno()
            raise OSError(error, f"setns into {name}: {os.strerror(error)}")


class Namespace:
    """One named network namespace, and threads of this process that joined it."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._threads: ThreadPoolExecutor | None = None

    def ip(self, *args: str) -> str:
        return _ip("-n", self.name, *args)

    def command(self, argv: list[str]) -> list[str]:
        """`argv` run inside the namespace (`ip netns exec` execs it: the pid is argv's)."""
        return ["ip", "netns", "exec", self.name, *argv]

    def call(self, fn: Callable[..., T], *args: Any) -> T:
        """`fn(*args)` on a thread inside the namespace: its sockets are the namespace's."""
        return self._pool().submit(fn, *args).result()

    async def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """`coroutine` in an event loop of its own, on a thread inside the namespace."""
        return await asyncio.wrap_future(self._pool().submit(asyncio.run, coroutine))

    def fetch_json(self, url: str, timeout_s: float = 2.0) -> Any:
        """GET `url` from inside the namespace (the nodes' monitoring endpoints)."""

        def get() -> Any:
            with urllib.request.urlopen(url, timeout=timeout_s) as response:
                return json.load(response)

        return self.call(get)

    def _pool(self) -> ThreadPoolExecutor:
        if self._threads is None:
            self._threads = ThreadPoolExecutor(
                HUB_THREADS, thread_name_prefix=self.name, initializer=_join, initargs=(self.name,)
            )
        return self._threads

    def close(self) -> None:
        """Let the threads go (a namespace lives on while a thread is inside), then delete it."""
        if self._threads is not None:
            self._threads.shutdown(wait=True, cancel_futures=True)
            self._threads = None
        with contextlib.suppress(RuntimeError):  # already gone
            _ip("netns", "delete", self.name)


class Network:
    """A hub namespace holding bridge br0 and `size` node namespaces, each joined to the bridge
    by a veth pair: v<i> in the hub, eth0 in node i, whose address is <SUBNET>.<i>."""

    def __init__(self, size: int = 3) -> None:
        run = f"{NAME_PREFIX}{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.hub = Namespace(f"{run}-hub")
        self.nodes = [Namespace(f"{run}-n{i}") for i in range(1, size + 1)]

    @staticmethod
    def address(index: int) -> str:
        """Node `index`'s address (1-based)."""
        return f"{SUBNET}.{index}"

    def create(self) -> Network:
        if os.geteuid() != 0 or shutil.which("ip") is None:
            raise NamespacesUnavailable("network namespaces need root and iproute2's `ip`")
        remove_leftovers()
        try:
            _ip("netns", "add", self.hub.name)
        except RuntimeError as exc:
            raise NamespacesUnavailable(f"cannot make a network namespace: {exc}") from exc
        try:
            self._build()
        except BaseException:
            self.destroy()
            raise
        return self

    def _build(self) -> None:
        hub = self.hub
        hub.ip("link", "set", "lo", "up")
        hub.ip("link", "add", "br0", "type", "bridge")  # STP off: ports forward at once
        hub.ip("addr", "add", f"{HUB_ADDRESS}/24", "dev", "br0")
        hub.ip("link", "set", "br0", "up")
        for index, node in enumerate(self.nodes, start=1):
            _ip("netns", "add", node.name)
            hub.ip(
                "link",
                "add",
                f"v{index}",
                "type",
                "veth",
                "peer",
                "name",
                "eth0",
                "netns",
                node.name,
            )
            hub.ip("link", "set", f"v{index}", "master", "br0", "up")
            node.ip("addr", "add", f"{self.address(index)}/24", "dev", "eth0")
            node.ip("link", "set", "eth0", "up")
            node.ip("link", "set", "lo", "up")

    def destroy(self) -> None:
        """Delete every namespace (their links go with them). Safe to call twice."""
        for namespace in [self.hub, *self.nodes]:
            namespace.close()

    def link_down(self, index: int) -> None:
        """Node `index`'s hub end down: its eth0 loses carrier and every packet to or from it
        is dropped, as when a cable is pulled. Nobody is told."""
        self.hub.ip("link", "set", f"v{index}", "down")

    def link_up(self, index: int) -> None:
        self.hub.ip("link", "set", f"v{index}", "up")

    @contextlib.contextmanager
    def reach_only(self, index: int) -> Iterator[None]:
        """While inside, the hub reaches node `index` only: a connection to another node fails
        at once (unreachable), so a client given every URL connects to that one. The nodes
        still reach each other (the bridge forwards their traffic; these are the hub's routes)."""
        others = [self.address(i) for i in range(1, len(self.nodes) + 1) if i != index]
        added = []
        try:
            for address in others:
                self.hub.ip("route", "add", "unreachable", f"{address}/32")
                added.append(address)
            yield
        finally:
            for address in added:
                self.hub.ip("route", "delete", "unreachable", f"{address}/32")


def remove_leftovers() -> None:
    """Delete the namespaces of runs whose test process is gone and that no process is in."""
    for line in _ip("netns", "list").splitlines():
        name = line.split()[0] if line.split() else ""
        parts = name.split("-")
        if not name.startswith(NAME_PREFIX) or len(parts) < 4 or not parts[1].isdigit():
            continue
        if alive(int(parts[1])) or _ip("netns", "pids", name).strip():
            continue
        with contextlib.suppress(RuntimeError):  # another run removed it first
            _ip("netns", "delete", name)


@dataclass
class NetnsNode(ClusterNode):
    """A cluster node inside a namespace of its own, reached from the hub; its monitoring
    endpoint (/jsz, /connz, /healthz) on MONITOR_PORT."""

    namespace: Namespace = field(kw_only=True)
    hub: Namespace = field(kw_only=True)
    frozen: bool = False

    def command(self) -> list[str]:
        return self.namespace.command([*super().command(), "-m", str(MONITOR_PORT)])

    def ready(self) -> bool:
        return self.hub.call(port_open, self.port, self.host)

    def monitor(self, path: str) -> Any:
        """The JSON of a monitoring endpoint, e.g. "/jsz?consumers=true"."""
        return self.hub.fetch_json(f"http://{self.host}:{MONITOR_PORT}{path}")

    def freeze(self) -> None:
        """SIGSTOP: its sockets stay open and the kernel still acknowledges what it receives,
        but nothing answers."""
        assert self.process is not None
        self.process.send_signal(signal.SIGSTOP)
        self.frozen = True

    def thaw(self) -> None:
        if self.process is not None and self.frozen:
            self.process.send_signal(signal.SIGCONT)
        self.frozen = False

    def stop(self, timeout_s: float = 5.0) -> None:
        self.thaw()  # a stopped process would hold SIGTERM until the timeout
        super().stop(timeout_s)


class NetnsCluster(NatsCluster):
    """NatsCluster on a Network: node i (server name n<i>) in the network's node namespace i."""

    def __init__(self, data_dir: Path, network: Network) -> None:
        self.network = network
        self.hub = network.hub
        count = len(network.nodes)
        routes = [f"nats://{network.address(i)}:{ROUTE_PORT}" for i in range(1, count + 1)]
        self.nodes = [
            NetnsNode(
                data_dir / f"n{i}",
                server_name=f"n{i}",
                host=network.address(i),
                port=CLIENT_PORT,
                cluster_port=ROUTE_PORT,
                routes=[route for j, route in enumerate(routes, start=1) if j != i],
                namespace=namespace,
                hub=network.hub,
            )
            for i, namespace in enumerate(network.nodes, start=1)
        ]

    def wait_ready(self, timeout_s: float = 30.0) -> None:
        """Until JetStream's meta leader counts every other node a current peer: a stream
        with three replicas can be placed (before, it may find "no suitable peers")."""
        deadline = time.monotonic() + timeout_s
        while not self._meta_group_complete():
            if time.monotonic() > deadline:
                raise RuntimeError("the NATS cluster's JetStream peers did not all join in time")
            time.sleep(0.2)

    def _meta_group_complete(self) -> bool:
        try:
            leader = self.monitor("/jsz")["meta_cluster"]["leader"]
            peers = self.netns_node(leader).monitor("/jsz")["meta_cluster"]["replicas"]
        except (OSError, KeyError, TypeError, ValueError, StopIteration):
            return False
        return len(peers) == len(self.nodes) - 1 and all(peer["current"] for peer in peers)

    def netns_node(self, server_name: str) -> NetnsNode:
        node = self.node(server_name)
        assert isinstance(node, NetnsNode)
        return node

    def index(self, server_name: str) -> int:
        return self.nodes.index(self.node(server_name)) + 1

    def cut(self, server_name: str) -> None:
        self.network.link_down(self.index(server_name))

    def heal(self, server_name: str) -> None:
        self.network.link_up(self.index(server_name))

    def freeze(self, server_name: str) -> None:
        self.netns_node(server_name).freeze()

    def thaw(self, server_name: str) -> None:
        self.netns_node(server_name).thaw()

    def reach_only(self, server_name: str) -> contextlib.AbstractContextManager[None]:
        return self.network.reach_only(self.index(server_name))

    def monitor(self, path: str) -> Any:
        """A monitoring endpoint's JSON, from the first node that answers."""
        error: Exception = RuntimeError("no node")
        for node in self.nodes:
            assert isinstance(node, NetnsNode)
            try:
                return node.monitor(path)
            except OSError as exc:
                error = exc
        raise error

    def leaders(self, stream: str, consumer: str) -> dict[str, str]:
        """Which node leads JetStream's meta group, `stream` and its `consumer` (/jsz)."""
        jsz = self.monitor("/jsz?accounts=true&streams=true&consumers=true")
        accounts = jsz["account_details"]
        streams = [one for account in accounts for one in account.get("stream_detail", [])]
        found = next(one for one in streams if one["name"] == stream)
        consumers = found.get("consumer_detail", [])
        of_consumer = next(one for one in consumers if one["name"] == consumer)
        return {
            "meta": jsz["meta_cluster"]["leader"],
            "stream": found["cluster"]["leader"],
            "consumer": of_consumer["cluster"]["leader"],
        }

    def server_of(self, address: str) -> str | None:
        """The server name of a node's address, None for another address."""
        return next((node.server_name for node in self.nodes if node.host == address), None)
