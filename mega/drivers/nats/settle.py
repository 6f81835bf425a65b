"""How one lane's deliveries are settled on NATS JetStream: ack, nak with a delay, term, a
retry as a scheduled message, a dead letter stored before its original is ended; and the
latest settles sent again after a reconnect or an election (`resettle`).
"""

from __future__ import annotations

import json
import logging
import time
from collections import deque
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any, Protocol

from nats.errors import MaxPayloadError
from nats.js.errors import APIError

from mega.drivers.base import Delivery, DlqRecord, DriverUnavailable, Lane, MessageTooLarge
from mega.drivers.nats.errors import NATS_ERRORS
from mega.drivers.nats.names import (
    HEADER_ATTEMPTS,
    HEADER_EMITTED_AT,
    HEADER_ENQUEUED_AT,
    HEADER_EVENT_ID,
    HEADER_EVENT_NAME,
    HEADER_FLOW_KEY,
    HEADER_JOB_ID,
    HEADER_RUN_AT,
    NATS_MSG_ID,
    dlq_record_subject,
    requeue_subject_of,
    schedule_headers,
    schedule_subject,
)

if TYPE_CHECKING:
    from nats.aio.client import Client as NatsClient
    from nats.aio.msg import Msg
    from nats.js import JetStreamContext

logger = logging.getLogger("mega.jobqueue")

# nats-py sends a bare nak for nak(delay=0): a zero delay still takes the delayed path.
MIN_NAK_DELAY_S = 0.001
# Settles (ack, nak, term) sent this recently are sent again after a reconnect, and when the
# consumer gets a new leader: those written to a connection that had gone silent, or sent while
# the consumer had no leader, never arrived, and each would hold a slot of the group's
# max_ack_pending for a whole ack wait. A silent server is left within about 3 s (a ping every
# NATS_PING_INTERVAL_S, NATS_MAX_OUTSTANDING_PINGS unanswered), and an election takes a few
# seconds more; this covers both.
RESETTLE_WINDOW_S = 15.0
# ... and at most this many of them beyond the lane's concurrency: after a server goes silent
# nothing new arrives, so a process settles at most what it held, its concurrency.
RESETTLE_SPARE = 64
ACK = b"+ACK"
TERM = b"+TERM"


class NatsLink(Protocol):
    """What a receiver needs of its bus (a NatsBus)."""

    native: NatsClient
    js: JetStreamContext

    @property
    def schedules_supported(self) -> bool: ...

    async def restore(self, lane: Lane) -> None:
        """Make the lane's streams and consumer exist again."""
        ...

    def window_safe(self, lane: Lane) -> bool:
        """Whether the lane's consumer caps unacked messages at the lane's concurrency."""
        ...

    async def publish_envelopes(
        self, envelopes: list[tuple[str, bytes, dict[str, str]]], timeout_s: float | None = None
    ) -> list[bool]:
        """Publish (subject, body, headers) and wait for every PubAck."""
        ...


class Settler:
    """The settling calls of one lane's receiver (see the module)."""

    def __init__(self, bus: NatsLink, lane: Lane) -> None:
        self.bus = bus
        self.lane = lane
        self.nc = bus.native
        self.schedules = bus.schedules_supported
        # (when, ack subject, payload) of the latest settles, sent again after a reconnect.
        self.settled: deque[tuple[float, str, bytes]] = deque(
            maxlen=lane.concurrency + RESETTLE_SPARE
        )

    async def ack(self, delivery: Delivery) -> None:
        await self.end(delivery.handle, ACK)

    async def extend(self, delivery: Delivery) -> None:
        await settle_quietly(delivery.handle.in_progress())

    async def release(self, delivery: Delivery, *, delay_s: float) -> None:
        await self.end(delivery.handle, nak_payload(delay_s))

    async def retry(self, delivery: Delivery, *, due_ms: int, attempts: int) -> None:
        """The next attempt as a message scheduled for `due_ms`, then ack this one. Where
        schedules are missing, or the publish fails, nak with the delay instead."""
        msg = delivery.handle
        if self.schedules:
            target = requeue_subject_of(self.lane)
            headers = requeue_headers(
                self.lane, delivery.id, delivery.subject, delivery.enqueued_at_ms, due_ms
            )
            headers[HEADER_ATTEMPTS] = str(attempts)
            if delivery.flow_key is not None:
                headers[HEADER_FLOW_KEY] = delivery.flow_key
            headers.update(schedule_headers(target, due_ms))
            if delivery.trace:
                headers.update(delivery.trace)
            try:
                await self.bus.js.publish(schedule_subject(target), msg.data, headers=headers)
            except APIError as exc:  # the stream refuses schedules (made before 2.12)
                self.schedules = False
                logger.warning(
                    "%s: its stream takes no message schedules (%s): a retry waits holding its "
                    "slot (recreate the stream on nats-server 2.12+ to lift this)",
                    self.lane.name,
                    exc.description,
                )
            except NATS_ERRORS as exc:
                logger.debug("%s: retry not scheduled (%s); nak instead", self.lane.name, exc)
            else:
                await self.end(msg, ACK)
                return
        await self.end(msg, nak_payload((due_ms - time.time() * 1000) / 1000))

    async def dead_letter(self, delivery: Delivery, record: DlqRecord, *, terminate: bool) -> None:
        """Publish the record, wait for its PubAck, and only then ack (or term) the original.
        The dedup id is keyed on the message's stream sequence: a retried publish of it dedups,
        while the same job requeued (a new message) and failing again gets a record of its
        own."""
        headers = {NATS_MSG_ID: f"{record['id']}:dlq:{delivery.key}"}
        try:
            await self.bus.js.publish(
                dlq_record_subject(self.lane, record["id"]),
                json.dumps(record).encode(),
                headers=headers,
            )
        except MaxPayloadError as exc:
            raise MessageTooLarge(self.nc.max_payload) from exc
        except NATS_ERRORS as exc:
            raise DriverUnavailable(str(exc) or repr(exc)) from exc
        await self.end(delivery.handle, TERM if terminate else ACK)

    async def end(self, msg: Msg, payload: bytes) -> None:
        """Send the settle that ends this delivery, and remember it for a reconnect."""
        self.settled.append((time.monotonic(), msg.reply, payload))
        await settle_quietly(self.nc.publish(msg.reply, payload))

    async def resettle(self, why: str = "the reconnect") -> None:
        """After a reconnect or an election: send again the settles of the last
        RESETTLE_WINDOW_S. One that had arrived changes nothing (the message is gone, or a later
        settle wins); one that was lost frees its slot now instead of after the ack wait."""
        since = time.monotonic() - RESETTLE_WINDOW_S
        again = [(reply, payload) for at, reply, payload in self.settled if at >= since]
        for reply, payload in again:
            await settle_quietly(self.nc.publish(reply, payload))
        if again:
            logger.info("%s: %d settle(s) sent again after %s", self.lane.name, len(again), why)


def requeue_headers(
    lane: Lane, job_id: str, subject: str, first_enqueued_at: int | None, run_at_ms: int
) -> dict[str, str]:
    """The headers of a message that brings a job or event back (a retry, a DLQ requeue)."""
    if lane.kind == "job":
        headers = {HEADER_JOB_ID: job_id, HEADER_RUN_AT: str(run_at_ms)}
        if first_enqueued_at is not None:
            headers[HEADER_ENQUEUED_AT] = str(first_enqueued_at)
        return headers
    emitted = first_enqueued_at if first_enqueued_at is not None else run_at_ms
    return {
        HEADER_EVENT_ID: job_id,
        HEADER_EVENT_NAME: subject,
        HEADER_EMITTED_AT: str(emitted),
        HEADER_RUN_AT: str(run_at_ms),
    }


def nak_payload(delay_s: float) -> bytes:
    """A nak asking for redelivery after `delay_s` (nats-py's own `nak(delay=)` body)."""
    delay_ns = int(max(delay_s, MIN_NAK_DELAY_S) * 1e9)
    return b'-NAK {"delay":%d}' % delay_ns


async def settle_quietly(reply: Coroutine[Any, Any, Any]) -> None:
    """Send an ack/nak/term/progress; if NATS is away the message is simply redelivered later."""
    try:
        await reply
    except NATS_ERRORS as exc:
        logger.debug("ack not sent (%s); the message will be redelivered", exc)
