"""What every part of the NATS bus shares: the connection, its JetStream context and the
pipelined publish of many messages (`NatsCore`), and how a stream is made where missing.
The parts: bus.py (the lanes), dead.py (dead letters), records.py (records), events.py (events).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Self

from nats.aio.client import Client as NatsClient
from nats.errors import MaxPayloadError, NoRespondersError
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js import JetStreamContext
from nats.js.api import (
    PubAck,
    StreamConfig,
)
from nats.js.errors import APIError, NotFoundError

from mega.drivers.base import (
    DriverUnavailable,
    Lane,
    MessageTooLarge,
)
from mega.drivers.nats.acks import BULK_TIMEOUT_PER_MSG_S, BULK_TIMEOUT_S, AckMux
from mega.drivers.nats.connection import Reconnects, connect_nats
from mega.drivers.nats.errors import NATS_ERRORS
from mega.errors import JobError
from mega.settings import BusSpec

# What a message's headers may take of the server's max_payload: ids and keys (200 characters
# each at most), times, a trace context.
HEADER_ROOM_BYTES = 4096
# JetStream's answer to a publish whose Nats-Msg-Id an earlier publish still being stored
# carries: a duplicate, not a failure (the first one's message is the job).
DUPLICATE_IN_PROCESS = 10158
# Broker-side message schedules (delayed jobs, scheduled retries) exist since this nats-server.
SCHEDULES_SINCE = (2, 12)
# Setting streams and consumers up asks this many times when JetStream answers late (a cluster
# electing leaders, or busy making replicas), this long apart, before NATS counts as
# unavailable: each ask waits out the client's request timeout (5 s), so the three cover an
# election (4 to 9 s).
ENSURE_ATTEMPTS = 3
ENSURE_PAUSE_S = 0.5

logger = logging.getLogger("mega.jobqueue")


class NatsCore:
    """A connection to NATS JetStream: `native` is the nats-py client (reconnecting forever),
    `js` its one JetStreamContext (its async-publish inbox is made once)."""

    def __init__(
        self, alias: str, spec: BusSpec, client: NatsClient, watch: Reconnects | None = None
    ) -> None:
        self.alias = alias
        self.spec = spec
        self.native: NatsClient = client
        self.watch = watch or Reconnects()
        self.js: JetStreamContext = client.jetstream()
        self.acks = AckMux(client)  # pipelined writes of records (see acks.py)
        self._events_max_age_s: float | None = None
        self._apply_limits: dict[Lane, bool] = {}
        self._max_ack_pending: dict[Lane, int | None] = {}  # what each lane's consumer runs with

    async def patiently(self, what: str, step: Callable[[], Awaitable[None]]) -> None:
        """Run a set-up `step` (idempotent: streams, buckets, a consumer), asking again when
        JetStream answers late, ENSURE_ATTEMPTS times; DriverUnavailable after that, or at
        once for any other NATS error."""
        for attempt in range(1, ENSURE_ATTEMPTS + 1):
            try:
                await step()
                return
            except (NatsTimeoutError, NoRespondersError) as exc:
                if attempt == ENSURE_ATTEMPTS:
                    raise DriverUnavailable(str(exc) or type(exc).__name__) from exc
                logger.info("%s: JetStream answered late (%s); asking again", what, exc)
                await asyncio.sleep(ENSURE_PAUSE_S)
            except NATS_ERRORS as exc:
                raise DriverUnavailable(str(exc) or type(exc).__name__) from exc

    @classmethod
    async def connect(cls, alias: str, spec: BusSpec) -> Self:
        watch = Reconnects()
        return cls(alias, spec, await connect_nats(alias, str(spec.url), watch), watch)

    @property
    def disconnects(self) -> int:
        """Times the connection was lost (a node went away or went silent) since connecting."""
        return self.watch.disconnects

    @property
    def url(self) -> str:
        return str(self.spec.url)

    @property
    def connected(self) -> bool:
        return bool(self.native.is_connected)

    @property
    def max_body_bytes(self) -> int:
        """The largest body a publish may carry: the server's `max_payload` (1 MB unless set
        otherwise) less room for mega's headers, which count in it."""
        return int(self.native.max_payload) - HEADER_ROOM_BYTES

    @property
    def schedules_supported(self) -> bool:
        """Whether the connected nats-server has message schedules (2.12+)."""
        version = self.native.connected_server_version
        return (version.major, version.minor) >= SCHEDULES_SINCE

    async def close(self) -> None:
        self.watch.closing = True
        with contextlib.suppress(Exception):
            await self.native.drain()

    def on_lost(self, callback: Callable[[str], None]) -> None:
        """Call `callback(reason)` if the connection is closed for good other than by `close`
        (the host then exits for its supervisor to start it again)."""
        self.watch.when_lost.append(callback)

    async def ping(self) -> None:
        if not self.native.is_connected:
            raise DriverUnavailable("disconnected")
        try:
            await self.native.flush(timeout=1)
        except NATS_ERRORS as exc:
            raise DriverUnavailable(str(exc) or type(exc).__name__) from exc

    def _check_connected(self) -> None:
        # While reconnecting, nats-py buffers publishes and sends them once back: a publish
        # that timed out would then still be stored. Refusing up front keeps "raised" meaning
        # "not stored" (but for a drop in mid-flight: give an id to make retries safe).
        if not self.native.is_connected:
            raise DriverUnavailable(f"NATS bus {self.alias!r} is not connected")

    async def publish_envelopes(
        self, envelopes: list[tuple[str, bytes, dict[str, str]]], timeout_s: float | None = None
    ) -> list[bool]:
        """Publish and wait for every PubAck; True each one stored, False a duplicate id (also
        one whose first publish is still in process: the message is the first's, not lost)."""
        if len(envelopes) == 1:
            subject, body, headers = envelopes[0]
            try:
                return [stored(await self.js.publish(subject, body, headers=headers))]
            except MaxPayloadError as exc:
                raise MessageTooLarge(self.native.max_payload) from exc
            except NATS_ERRORS as exc:
                return [stored(exc)]
        futures: list[asyncio.Future[Any]] = []
        try:
            for subject, body, headers in envelopes:
                futures.append(await self.js.publish_async(subject, body, headers=headers))
            if timeout_s is None:
                timeout_s = BULK_TIMEOUT_S + BULK_TIMEOUT_PER_MSG_S * len(envelopes)
            # asyncio.timeout, not wait_for: a stop that cancels this task then takes the
            # gather's CancelledError itself (wait_for left it unretrieved, and logged).
            async with asyncio.timeout(timeout_s):
                acks = await asyncio.gather(*futures, return_exceptions=True)
        except MaxPayloadError as exc:  # raised before it is sent: the earlier ones may stand
            for future in futures:
                future.cancel()
            raise MessageTooLarge(self.native.max_payload) from exc
        except NATS_ERRORS as exc:
            for future in futures:
                future.cancel()  # frees nats-py's in-flight slot of an ack that never came
            raise DriverUnavailable(str(exc) or type(exc).__name__) from exc
        return [stored(answer) for answer in acks]


def stored(answer: PubAck | BaseException) -> bool:
    """What JetStream answered one publish: True stored, False a duplicate id (also one whose
    first publish is still being stored: the first's message is the job, nothing failed);
    DriverUnavailable for anything else."""
    if isinstance(answer, APIError) and answer.err_code == DUPLICATE_IN_PROCESS:
        return False
    if isinstance(answer, BaseException):
        raise DriverUnavailable(str(answer) or type(answer).__name__) from answer
    return not answer.duplicate


async def ensure_stream(js: JetStreamContext, config: StreamConfig) -> None:
    """Create a stream unless it exists; an existing one is never changed (its limits are the
    operator's). Safe to race with other processes."""
    assert config.name is not None
    try:
        await js.stream_info(config.name)
        return
    except NotFoundError:
        pass
    try:
        await js.add_stream(config)
    except APIError as exc:
        # A peer may have created it between our look-up and our create.
        try:
            await js.stream_info(config.name)
        except NotFoundError:
            raise JobError(
                f"cannot create stream {config.name} on {config.subjects}: {exc.description}",
                code="job.stream_conflict",
            ) from exc
