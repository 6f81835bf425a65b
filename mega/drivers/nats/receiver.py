"""One lane consumed in this process on NATS JetStream: pull requests, and settling (its calls
in settle.py).

Why not `PullSubscription.fetch(n)`: once the stream is empty, fetch waits for all `n`
messages or its timeout, so a lone job would wait seconds for a batch to fill. Here pull
requests are sent by hand (`$JS.API.CONSUMER.MSG.NEXT`) to one inbox, and every message is
handed over the moment it lands. `credits` counts messages asked for and not yet received;
asking only for the free slots keeps this process within them, and the consumer's
max_ack_pending keeps the whole group within `concurrency`.

A retry is a new message, a broker-side schedule (nats-server 2.12+) that lands on the
requeue subject at the backoff's end, and the failed one is acked once it is stored: a job
backing off holds no slot. Without schedules (an older server, a stream made before it) a
retry is `nak(delay=backoff)`, and the message holds its slot while it waits.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from nats.aio.msg import Msg

from mega.constants import CLOSE_TASKS_S
from mega.drivers.base import Delivery, DriverUnavailable, Lane
from mega.drivers.nats.errors import NATS_ERRORS
from mega.drivers.nats.fair import Feeder
from mega.drivers.nats.names import (
    EVENT_PREFIX,
    HEADER_ATTEMPTS,
    HEADER_EMITTED_AT,
    HEADER_ENQUEUED_AT,
    HEADER_EVENT_ID,
    HEADER_EVENT_NAME,
    HEADER_FLOW_KEY,
    HEADER_JOB_ID,
    HEADER_RUN_AT,
    NATS_MSG_ID,
    durable_of,
    fair_wake_of,
    stream_of,
)
from mega.drivers.nats.settle import NatsLink, Settler, settle_quietly
from mega.tasks import cancel_and_wait, wait_event
from mega.tracing import carried

if TYPE_CHECKING:
    pass

logger = logging.getLogger("mega.jobqueue")

# A pull request lives this long on the server; an idle fetch returns after at most this.
PULL_EXPIRES_S = 5.0
# Credit of pull requests that never answered (lost in an outage) is forgotten this much after
# they should have expired.
PULL_GRACE_S = 1.0
# A waiting pull request has the server say it is alive this often when nothing is delivered
# (an idle heartbeat, status 100)...
PULL_HEARTBEAT_S = 1.0
# ... and one that has said nothing for this long is taken for gone: asked of a consumer that
# had no leader (one is elected while this process cannot hear its announcement, as after a
# partition heals), or held by a node that went away. Its credit is forgotten and the pull made
# again, instead of waiting out PULL_EXPIRES_S and PULL_GRACE_S.
PULL_SILENT_S = 2.5
# Pull again once this fraction of the slots is free (or nothing is asked at all): one request
# per half window keeps messages flowing without one request per job.
REFILL_FRACTION = 0.5
# An idle fetch returns this often, so the loop notices a stop or a reconnect.
IDLE_WAIT_S = 0.5
# Pause after NATS refused a pull (JetStream restarting, consumer gone) before asking again.
OUTAGE_BACKOFF_S = 0.25
# JetStream announces each election of a consumer's leader here (+ ".<stream>.<consumer>"), and
# of a stream's leader here (+ ".<stream>").
LEADER_ELECTED = "$JS.EVENT.ADVISORY.CONSUMER.LEADER_ELECTED"
STREAM_LEADER_ELECTED = "$JS.EVENT.ADVISORY.STREAM.LEADER_ELECTED"
# After an election, the settles are sent once more this much later: a node waking from a
# freeze can set off a second round of elections, and settles sent in between are lost too.
RESETTLE_AGAIN_S = 2.0


class NatsReceiver(Settler):
    """The pull requests of one lane in this process (see the module), and its settling calls
    (`Settler`, settle.py)."""

    def __init__(
        self, bus: NatsLink, lane: Lane, on_reconnect: set[Callable[[], Awaitable[None]]]
    ) -> None:
        super().__init__(bus, lane)
        self.stream = stream_of(lane)
        self.pull_subject = f"$JS.API.CONSUMER.MSG.NEXT.{self.stream}.{durable_of(lane)}"
        self.pull_expires_ns = int(PULL_EXPIRES_S * 1e9)
        self.pull_heartbeat_ns = int(PULL_HEARTBEAT_S * 1e9)
        self.refill_at = max(1, math.ceil(lane.concurrency * REFILL_FRACTION))
        self.arrived: deque[Msg] = deque()
        self.ready = asyncio.Event()
        self.credits = 0
        self.credits_expire_at = 0.0
        self.heard_at = 0.0  # the last message or status on the inbox, or the last pull
        self.pause_until = 0.0
        self.needs_ensure = False
        self.last_warning = ""
        self.inbox = ""
        self.subscription: Any = None
        self.elections: list[Any] = []
        self.leader_subjects = (
            f"{LEADER_ELECTED}.{self.stream}.{durable_of(lane)}",
            f"{STREAM_LEADER_ELECTED}.{self.stream}",
        )
        self.resettle_later: asyncio.Task[None] | None = None
        self.reconnects = self.nc.stats["reconnects"]
        self.woken = False
        self.on_reconnect = on_reconnect
        on_reconnect.add(self.resettle)
        # A fair lane is fed from its keys' subjects (a prioritized one from its bands'; fair.py)
        # by one task, beside the pulls: asked at each fetch, and when a publisher says fair
        # jobs came (its wake subject).
        self.feeder = Feeder(self.nc, bus.js, lane, bus.publish_envelopes) if lane.turns else None
        self.feed_wanted = asyncio.Event()
        self.feeding: asyncio.Task[None] | None = None
        self.wakes: Any = None

    # -- fetching -----------------------------------------------------------------------------

    async def fetch(self, limit: int) -> list[Delivery]:
        if self.subscription is None:
            self.inbox = self.nc.new_inbox()
            self.subscription = await self.nc.subscribe(self.inbox, cb=self._on_message)
            self.elections = [
                await self.nc.subscribe(subject, cb=self._on_leader)
                for subject in self.leader_subjects
            ]
            if self.feeder is not None:
                self.wakes = await self.nc.subscribe(fair_wake_of(self.lane), cb=self._on_fair)
                self.feeding = asyncio.create_task(self._feed())
        self.feed_wanted.set()
        if self.arrived:  # the next pull leaves before this batch runs: its round trip is hidden
            await self._top_up(limit, time.monotonic())
        deadline = time.monotonic() + IDLE_WAIT_S
        while not self.arrived:
            if self.woken:
                self.woken = False
                return []
            self.ready.clear()  # before the awaits below: a message landing there sets it
            now = time.monotonic()
            await self._top_up(limit, now)
            wait_s = deadline - now
            if self.pause_until > now:
                wait_s = min(wait_s, self.pause_until - now)
            if wait_s <= 0:
                return []
            await wait_event(self.ready, wait_s)
            if time.monotonic() >= deadline and not self.arrived:
                return []
        taken = [self.arrived.popleft() for _ in range(min(limit, len(self.arrived)))]
        return [self._delivery(msg) for msg in taken]

    def wake(self) -> None:
        self.woken = True
        self.ready.set()

    async def _top_up(self, limit: int, now: float) -> None:
        if self.nc.stats["reconnects"] != self.reconnects or (
            self.credits and (now > self.credits_expire_at or now - self.heard_at > PULL_SILENT_S)
        ):
            # Requests made before a reconnect are gone and will never answer, nor will those
            # that stopped sending heartbeats. A late message of one is still capped by
            # max_ack_pending.
            self.reconnects = self.nc.stats["reconnects"]
            self.credits = 0
        if self.needs_ensure and now >= self.pause_until:
            await self._ensure_again()
        # Ask for the whole window where the consumer's max_ack_pending is the lane's
        # concurrency: the server then never sends more than the slots (the group's unacked
        # messages are capped), and a request is always waiting when an ack frees one, so no
        # round trip is spent between batches. Otherwise (limits not applied), only the free
        # slots, so that no fetched message waits for one while its ack wait runs.
        window = self.lane.concurrency if self.bus.window_safe(self.lane) else limit
        free = window - self.credits - len(self.arrived)
        if (
            free > 0
            and (free >= self.refill_at or self.credits == 0)
            and now >= self.pause_until
            and self.nc.is_connected
        ):
            request = b'{"batch":%d,"expires":%d,"idle_heartbeat":%d}' % (
                free,
                self.pull_expires_ns,
                self.pull_heartbeat_ns,
            )
            try:
                await self.nc.publish(self.pull_subject, request, reply=self.inbox)
            except NATS_ERRORS as exc:
                logger.debug("%s: pull failed (%s); retrying", self.lane.name, exc)
                self.pause_until = now + OUTAGE_BACKOFF_S
                return
            self.credits += free
            self.credits_expire_at = now + PULL_EXPIRES_S + PULL_GRACE_S
            self.heard_at = now

    async def _feed(self) -> None:
        """Feed the fair lane each time it is asked, up to `concurrency` jobs not yet handed
        to a worker, the keys taking turns (fair.py): the pulls then find the next turns
        there while this process runs the ones before."""
        assert self.feeder is not None
        while True:
            await self.feed_wanted.wait()
            self.feed_wanted.clear()
            try:
                await self.feeder.feed(self.lane.concurrency)
            except DriverUnavailable as exc:
                self._warn(f"{self.lane.name}: cannot feed its fair lane yet: {exc}")
                await asyncio.sleep(OUTAGE_BACKOFF_S)
                self.feed_wanted.set()

    async def _on_fair(self, _msg: Msg) -> None:
        """A publisher stored fair jobs: feed them now."""
        self.feed_wanted.set()

    async def _ensure_again(self) -> None:
        self.needs_ensure = False
        try:
            await self.bus.restore(self.lane)
        except Exception as exc:
            self._warn(f"{self.lane.name}: cannot restore its stream/consumer yet: {exc}")
            self.needs_ensure = True
            self.pause_until = time.monotonic() + OUTAGE_BACKOFF_S

    async def _on_message(self, msg: Msg) -> None:
        if not msg.reply:  # job messages carry an ack subject; status messages do not
            self._on_status(msg)
            return
        self.heard_at = time.monotonic()
        if self.credits:
            self.credits -= 1
        self.arrived.append(msg)
        self.ready.set()

    async def _on_leader(self, _msg: Msg) -> None:
        """A new leader of the consumer or its stream: the pull requests the old one held are
        gone, and so are the settles sent while there was none. Ask again now, and settle again
        now and once more RESETTLE_AGAIN_S later."""
        self.credits = 0
        self.ready.set()
        if self.resettle_later is not None:
            self.resettle_later.cancel()
        self.resettle_later = asyncio.create_task(self._resettle_again())
        await self.resettle("a new leader")

    async def _resettle_again(self) -> None:
        await asyncio.sleep(RESETTLE_AGAIN_S)
        await self.resettle("a new leader, once more")

    def _on_status(self, msg: Msg) -> None:
        self.heard_at = time.monotonic()
        headers = msg.headers or {}
        status = headers.get("Status", "")
        if status == "100":  # idle heartbeat: a request is still waiting
            return
        # The request is over: drop what it will never deliver (all of it if the server
        # does not say).
        unfilled = headers.get("Nats-Pending-Messages")
        self.credits = max(0, self.credits - int(unfilled)) if unfilled else 0
        if status != "408":  # anything but a plain expiry: the consumer is not being served
            description = headers.get("Description", "")
            self._warn(f"{self.lane.name}: pull answered {status} {description}")
            self.pause_until = time.monotonic() + OUTAGE_BACKOFF_S
            # 404 (no such consumer), 409 "Consumer Deleted" while a pull waited, and 503 (no
            # responders: the pull came after the deletion, so nothing was there to answer it)
            # all mean the consumer may be gone: make it again (a no-op when it is there).
            if status in ("404", "503") or "deleted" in description.lower():
                self.needs_ensure = True
        self.ready.set()

    def _warn(self, message: str) -> None:
        # An outage repeats the same answer several times a second: say it once.
        if message != self.last_warning:
            logger.warning("%s", message)
            self.last_warning = message

    def _delivery(self, msg: Msg) -> Delivery:
        headers = msg.headers or {}
        seq = msg.metadata.sequence.stream
        attempt = (_int(headers.get(HEADER_ATTEMPTS)) or 0) + msg.metadata.num_delivered
        if self.lane.kind == "job":
            job_id = headers.get(HEADER_JOB_ID)
            subject = self.lane.subject
            enqueued = _int(headers.get(HEADER_ENQUEUED_AT))
        else:
            # Published once, the dedup id is the event id; a requeued event carries its own.
            job_id = headers.get(HEADER_EVENT_ID) or headers.get(NATS_MSG_ID)
            subject = headers.get(HEADER_EVENT_NAME) or msg.subject.removeprefix(EVENT_PREFIX)
            enqueued = _int(headers.get(HEADER_EMITTED_AT))
        return Delivery(
            id=job_id or f"{self.stream}:{seq}",
            subject=subject,
            body=msg.data,
            attempt=attempt,
            enqueued_at_ms=enqueued,
            run_at_ms=_int(headers.get(HEADER_RUN_AT)),
            key=seq,
            handle=msg,
            trace=carried(headers),
            flow_key=headers.get(HEADER_FLOW_KEY),
        )

    async def close(self) -> None:
        """Hand back what arrived and was never run (at once, not after its ack wait), stop
        listening, and send the last acks. A message of a pull request still open that lands
        after this comes back after its ack wait."""
        self.on_reconnect.discard(self.resettle)
        await cancel_and_wait([self.resettle_later, self.feeding], CLOSE_TASKS_S)
        while self.arrived:
            await settle_quietly(self.arrived.popleft().nak())
        for subscription in (self.subscription, *self.elections, self.wakes):
            if subscription is not None:
                with contextlib.suppress(*NATS_ERRORS):
                    await subscription.unsubscribe()
        with contextlib.suppress(*NATS_ERRORS):
            await self.nc.flush(timeout=1)  # the last acks and naks leave before we return


def _int(value: str | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None
