"""A real three-node NATS cluster for the scale-out tests: three nats-server processes on free
ports, joined by routes, JetStream on each (file storage), so streams can keep three replicas
and survive the loss of one node.

    cluster = NatsCluster(tmp_path).start()     # blocks until a stream can live on every node
    cluster.url                                  # "nats://127.0.0.1:a,nats://127.0.0.1:b,..."
    cluster.nodes[i].kill(); cluster.nodes[i].start()   # SIGKILL a node, bring it back
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from mega.drivers.embedded import EmbeddedServer, free_port
from mega.drivers.nats.embedded import find_nats_server

CLUSTER_NAME = "mega"


@dataclass
class ClusterNode(EmbeddedServer):
    """One nats-server of the cluster: a client port, a route port, JetStream on file."""

    name: ClassVar[str] = "nats"
    server_name: str = "n1"
    host: str = "127.0.0.1"  # the address both ports listen on
    cluster_port: int = field(default_factory=free_port)
    routes: list[str] = field(default_factory=list)

    def command(self) -> list[str]:
        return [
            find_nats_server(),
            "-a",
            self.host,
            "-p",
            str(self.port),
            "-n",
            self.server_name,
            "-js",
            "-sd",
            str(self.data_dir / "jetstream"),
            "--cluster_name",
            CLUSTER_NAME,
            "--cluster",
            f"nats://{self.host}:{self.cluster_port}",
            "--routes",
            ",".join(self.routes),
        ]

    @property
    def url(self) -> str:
        return f"nats://{self.host}:{self.port}"


class NatsCluster:
    def __init__(self, data_dir: Path, size: int = 3) -> None:
        ports = [free_port() for _ in range(size)]
        routes = [f"nats://127.0.0.1:{port}" for port in ports]
        self.nodes = [
            ClusterNode(
                data_dir / f"n{i + 1}",
                server_name=f"n{i + 1}",
                cluster_port=ports[i],
                routes=[route for j, route in enumerate(routes) if j != i],
            )
            for i in range(size)
        ]

    @property
    def url(self) -> str:
        return ",".join(node.url for node in self.nodes)

    def node(self, server_name: str) -> ClusterNode:
        return next(node for node in self.nodes if node.server_name == server_name)

    def start(self, timeout_s: float = 60.0) -> NatsCluster:
        for node in self.nodes:
            node.start()
        self.wait_ready(timeout_s)
        return self

    def wait_ready(self, timeout_s: float = 60.0) -> None:
        """Until the cluster can place a stream on every node.

        A meta leader alone is not enough: until each node has joined the meta group, a stream
        with one replica per node is refused ("no suitable peers for placement"). So the probe
        is the thing the tests do, a stream with `size` replicas, made and deleted.
        """
        import asyncio

        import nats
        from nats.js.api import StorageType, StreamConfig

        probe_stream = "MEGA_CLUSTER_READY"

        async def probe() -> bool:
            try:
                nc = await nats.connect(
                    servers=self.url.split(","), connect_timeout=1, allow_reconnect=False
                )
            except Exception:
                return False
            try:
                js = nc.jetstream(timeout=2)
                config = StreamConfig(
                    name=probe_stream,
                    subjects=["mega.cluster.ready"],
                    num_replicas=len(self.nodes),
                    storage=StorageType.MEMORY,
                )
                await js.add_stream(config)
                await js.delete_stream(probe_stream)
                return True
            except Exception:
                return False
            finally:
                await nc.close()

        deadline = time.monotonic() + timeout_s
        while not asyncio.run(probe()):
            if time.monotonic() > deadline:
                nodes = len(self.nodes)
                raise RuntimeError(f"the NATS cluster could not place a stream on {nodes} nodes")
            time.sleep(0.2)

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()
