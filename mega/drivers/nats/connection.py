"""The NATS connection a bus keeps: `connect_nats` (reconnecting forever, bounded at start) and
`Reconnects`, which counts the connection's losses and tells the host when it is closed for
good."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import random
import time
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import urlsplit

from nats.aio.client import Client as NatsClient
from nats.aio.client import Server

from mega.constants import (
    CONNECT_TIMEOUT_S,
    HOW_TO_GET_SERVICES,
    NATS_MAX_OUTSTANDING_PINGS,
    NATS_PING_INTERVAL_S,
    NATS_RECONNECT_WAIT_S,
)
from mega.errors import DependencyUnavailable

logger = logging.getLogger("mega.jobqueue")


class Reconnects:
    """What happens to one NATS client's connection: disconnects counted, and what must run
    again on the new connection (each receiver's `resettle`)."""

    def __init__(self) -> None:
        self.disconnects = 0
        self.server = "its server"  # host:port of the node the client is on
        self.hooks: set[Callable[[], Awaitable[None]]] = set()
        self.tried: dict[str, float] = {}  # host:port -> when last tried or lost (monotonic)
        self.closing = False  # set by our own close: the client's end is then no news
        self.when_lost: list[Callable[[str], None]] = []  # told if it is closed for good

    def lost(self) -> None:
        self.disconnects += 1
        self.tried[self.server] = time.monotonic()

    def choose(self, servers: list[Server], _info: dict[str, Any]) -> tuple[Server, float]:
        """The node to try next: the one least recently tried, the node just lost counting as
        tried at that moment, so it comes last (a frozen server still accepts TCP, a cut one
        does not answer, and either would hold the attempt for the whole connect timeout).
        A node tried within NATS_RECONNECT_WAIT_S is tried again only after that pause."""
        best = min(servers, key=lambda server: self.tried.get(server.uri.netloc, -math.inf))
        now = time.monotonic()
        delay_s = max(
            0.0, NATS_RECONNECT_WAIT_S - (now - self.tried.get(best.uri.netloc, -math.inf))
        )
        self.tried[best.uri.netloc] = now + delay_s  # tried when the pause ends
        return best, delay_s

    def closed(self, reason: str) -> None:
        """The client is closed and will not reconnect (the server refused something it sent
        with an -ERR, which nats-py ends the connection on): every receiver on it is stuck."""
        if self.closing:
            return
        logger.error("NATS connection closed for good (%s): nothing more is received", reason)
        for callback in self.when_lost:
            callback(reason)

    async def reconnected(self) -> None:
        for hook in list(self.hooks):
            try:
                await hook()
            except Exception:  # one receiver's trouble never keeps the others from theirs
                logger.exception("after a NATS reconnect")


async def connect_nats(alias: str, url: str, watch: Reconnects | None = None) -> NatsClient:
    """A client that reconnects forever, after a bounded check that some node answers. It
    pings every NATS_PING_INTERVAL_S, so a silent node is left within seconds."""
    client = NatsClient()
    watch = watch or Reconnects()

    async def disconnected() -> None:
        if not (client.is_closed or client.is_draining):  # our own shutdown is not news
            watch.lost()
            logger.warning("NATS %r lost %s; moving to another node", alias, watch.server)

    async def reconnected() -> None:
        watch.server = _server_of(client)
        logger.info("NATS %r reconnected to %s", alias, watch.server)
        await watch.reconnected()

    async def error(exc: Exception) -> None:
        logger.debug("NATS %r: %s", alias, exc)

    async def closed() -> None:
        watch.closed(str(client.last_error or "closed by the server"))

    try:
        # nats-py retries the *first* connect forever too when reconnects are unlimited, so
        # reachability is checked with a bounded probe first and the connect itself is capped.
        servers = url.split(",")  # a cluster: any node will do, the client learns the others
        await _probe_any(servers)
        # Shuffled once here, so that processes spread over the nodes; after losing one the
        # client picks the next with `watch.choose`, never the one it just lost first.
        connect = client.connect(
            servers=random.sample(servers, len(servers)),
            dont_randomize=True,
            reconnect_to_server_handler=watch.choose,
            name=f"mega:{alias}",
            connect_timeout=int(CONNECT_TIMEOUT_S),
            allow_reconnect=True,
            max_reconnect_attempts=-1,  # forever: a NATS restart is an outage, not a crash
            reconnect_time_wait=NATS_RECONNECT_WAIT_S,  # type: ignore[arg-type]  # float s works
            ping_interval=NATS_PING_INTERVAL_S,
            max_outstanding_pings=NATS_MAX_OUTSTANDING_PINGS,
            disconnected_cb=disconnected,
            reconnected_cb=reconnected,
            error_cb=error,
            closed_cb=closed,
        )
        await asyncio.wait_for(connect, CONNECT_TIMEOUT_S * 2)
        watch.server = _server_of(client)
        return client
    except Exception as exc:
        raise DependencyUnavailable(
            "nats", f"cannot reach NATS {alias!r} at {url} ({_reason(exc)}); {HOW_TO_GET_SERVICES}"
        ) from exc


async def _probe_any(urls: list[str]) -> None:
    """Return once one of `urls` accepts a TCP connection; raise the last error otherwise."""
    error: BaseException = OSError("no URL")
    for url in urls:
        parts = urlsplit(url)
        try:
            _reader, writer = await asyncio.wait_for(
                asyncio.open_connection(parts.hostname, parts.port or 4222), CONNECT_TIMEOUT_S
            )
        except (OSError, TimeoutError) as exc:
            error = exc
            continue
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()
        return
    raise error


def _server_of(client: NatsClient) -> str:
    url = client.connected_url
    return url.netloc if url is not None else "its server"


def _reason(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
