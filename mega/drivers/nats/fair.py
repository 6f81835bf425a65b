"""A fair lane on NATS JetStream: each key's jobs wait on a subject of their own until its turn.

A fair job's due messages are stored in the lane's fair stream (`MEGA_JOBS_<s>_FAIR`, limits
retention, direct gets allowed), on `<s>._fair.<key token>`, instead of on `<s>`. Before a
receiver pulls, it feeds the lane (`Feeder.feed`):

1. it reads how many of the lane's messages no worker was handed yet (the consumer's pending
   count) and the keys with jobs waiting (the fair stream's subjects, with their counts), and
   deals the room left, up to what it is about to pull, a job of each key in turn, from where
   its last feed stopped;
2. it reads each key's share at once (one batched direct get per key, all sent together);
3. it publishes them onto `<s>` in turn order, pipelined, each with a Nats-Msg-Id naming its
   place in the fair stream: a move made twice (two workers reading the same heads, or a
   worker dying before step 4) is stored once within the dedup window;
4. only then it purges what it moved, per key, below the last sequence it moved.

The lane's consumer, its pull requests, acks, retries and dead letters are untouched: a retry or
a delayed fair job goes straight to `<s>` when due. So a key with 10,000 jobs waiting holds
only its turns of the lane, and another key's first job is among the next ones pulled.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from nats.aio.msg import Msg

from mega.drivers.base import DriverUnavailable, Lane
from mega.drivers.nats.errors import NATS_ERRORS
from mega.drivers.nats.names import (
    HEADER_JOB_ID,
    NATS_MSG_ID,
    durable_of,
    fair_stream_of,
    fair_subjects_of,
    stream_of,
)

if TYPE_CHECKING:
    from nats.aio.client import Client as NatsClient
    from nats.js import JetStreamContext

logger = logging.getLogger("mega.jobqueue")

# How long a feed waits for the messages of its direct gets.
GET_TIMEOUT_S = 2.0
# A direct get's reply that ends a batch (EOB), or says there was nothing (no messages).
END_OF_BATCH = ("204", "404", "408")

Envelope = tuple[str, bytes, dict[str, str]]


class Feeder:
    """Feeds one fair lane from its keys' subjects, in one process (see the module)."""

    def __init__(
        self,
        nc: NatsClient,
        js: JetStreamContext,
        lane: Lane,
        publish: Callable[[list[Envelope]], Awaitable[list[bool]]],
    ) -> None:
        self.nc = nc
        self.js = js
        self.lane = lane
        self.publish = publish
        self.stream = fair_stream_of(lane)
        self.subjects = fair_subjects_of(lane)
        self.turns: deque[str] = deque()  # the keys' subjects, next turn first

    async def feed(self, room: int) -> int:
        """Move up to `room` jobs, less what the lane holds undelivered, onto the lane, the keys
        taking turns; how many. DriverUnavailable when NATS does not answer."""
        try:
            consumer, fair = await asyncio.gather(
                self.js.consumer_info(stream_of(self.lane), durable_of(self.lane)),
                self.js.stream_info(self.stream, subjects_filter=self.subjects),
            )
            room -= consumer.num_pending or 0
            waiting: dict[str, int] = fair.state.subjects or {}
            if room <= 0 or not waiting:
                return 0
            shares = self._deal(waiting, room)
            taken = await self._get(shares)
            order = _in_turns([taken[subject] for subject in shares])
            await self.publish([_moved(self.lane, msg) for msg in order])
            await asyncio.gather(*(
                self.js.purge_stream(self.stream, subject=subject, seq=_seq(msgs[-1]) + 1)
                for subject, msgs in taken.items() if msgs
            ))  # fmt: skip
        except NATS_ERRORS as exc:
            raise DriverUnavailable(str(exc) or type(exc).__name__) from exc
        return len(order)

    def _deal(self, waiting: dict[str, int], room: int) -> dict[str, int]:
        """How many of each key's jobs move now: one each in turn, from the key whose turn it
        is, until the room or the jobs run out. The next feed starts after the last served."""
        known = set(self.turns)
        self.turns = deque(subject for subject in self.turns if subject in waiting)
        self.turns.extend(subject for subject in waiting if subject not in known)
        shares: dict[str, int] = {}
        left = dict(waiting)
        while room > 0 and any(left.values()):
            subject = self.turns[0]
            self.turns.rotate(-1)
            if left[subject] > 0:
                shares[subject] = shares.get(subject, 0) + 1
                left[subject] -= 1
                room -= 1
        return shares

    async def _get(self, shares: dict[str, int]) -> dict[str, list[Msg]]:
        """Each key's first `share` messages: one batched direct get per key, sent together."""
        inbox = self.nc.new_inbox()
        found: dict[str, list[Msg]] = {subject: [] for subject in shares}
        ended: set[str] = set()
        done = asyncio.Event()
        replies = {f"{inbox}.{n}": subject for n, subject in enumerate(shares)}

        async def arrived(msg: Msg) -> None:
            subject = replies[msg.subject]
            status = (msg.headers or {}).get("Status")
            if status in END_OF_BATCH:
                ended.add(subject)
            else:
                found[subject].append(msg)
                if len(found[subject]) >= shares[subject]:
                    ended.add(subject)
            if len(ended) == len(shares):
                done.set()

        subscription = await self.nc.subscribe(f"{inbox}.*", cb=arrived)
        try:
            for reply, subject in replies.items():
                request = {"seq": 1, "next_by_subj": subject, "batch": shares[subject]}
                await self.nc.publish(
                    f"$JS.API.DIRECT.GET.{self.stream}", json.dumps(request).encode(),
                    reply=reply,
                )  # fmt: skip
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(GET_TIMEOUT_S):
                    await done.wait()
        finally:
            with contextlib.suppress(*NATS_ERRORS):
                await subscription.unsubscribe()
        return {subject: sorted(msgs, key=_seq) for subject, msgs in found.items()}


def _in_turns(per_key: list[list[Msg]]) -> list[Msg]:
    """The keys' messages interleaved: the first of each key, then the second of each..."""
    order: list[Msg] = []
    for rank in range(max(map(len, per_key), default=0)):
        order.extend(msgs[rank] for msgs in per_key if rank < len(msgs))
    return order


def _seq(msg: Msg) -> int:
    return int((msg.headers or {}).get("Nats-Sequence", 0))


def _moved(lane: Lane, msg: Msg) -> Envelope:
    """A fair message as published onto the lane: its own headers (not the server's, nor the
    caller's dedup id, already used), and an id of its place in the fair stream."""
    headers: dict[str, Any] = {
        name: value for name, value in (msg.headers or {}).items() if not name.startswith("Nats-")
    }
    headers[NATS_MSG_ID] = f"fair:{_seq(msg)}:{headers.get(HEADER_JOB_ID, '')}"
    return lane.subject, msg.data, headers
