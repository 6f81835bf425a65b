"""A fair lane on NATS JetStream: each key's jobs wait on a subject of their own until its turn.
A prioritized lane is fed the same way, a subject per band, the bands taking PRIORITY_TURNS.

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
from collections import Counter, deque
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from nats.aio.msg import Msg

from mega.drivers.base import PRIORITIES, DriverUnavailable, Lane, Priority, band_of_turn
from mega.drivers.nats.errors import NATS_ERRORS
from mega.drivers.nats.names import (
    HEADER_JOB_ID,
    NATS_MSG_ID,
    durable_of,
    fair_stream_of,
    fair_subject,
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
        # A prioritized lane's: each band's subject, and the turns taken (PRIORITY_TURNS).
        self.bands: dict[Priority, str] | None = None
        if lane.prioritized:
            self.bands = {band: fair_subject(lane, band) for band in PRIORITIES}
        self.turn = 0

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
            dealt = self._deal_bands(waiting, room) if self.bands else self._deal(waiting, room)
            taken = await self._get(dict(Counter(dealt)))
            order = _in_turns(dealt, taken)
            await self.publish([_moved(self.lane, msg) for msg in order])
            await asyncio.gather(
                *(
                    self.js.purge_stream(self.stream, subject=subject, seq=_seq(msgs[-1]) + 1)
                    for subject, msgs in taken.items()
                    if msgs
                )
            )
        except NATS_ERRORS as exc:
            raise DriverUnavailable(str(exc) or type(exc).__name__) from exc
        return len(order)

    def _deal(self, waiting: dict[str, int], room: int) -> list[str]:
        """Whose jobs move now, in order (a key's subject per job): one each in turn, from the
        key whose turn it is, until the room or the jobs run out. The next feed starts after
        the last served."""
        known = set(self.turns)
        self.turns = deque(subject for subject in self.turns if subject in waiting)
        self.turns.extend(subject for subject in waiting if subject not in known)
        dealt: list[str] = []
        left = dict(waiting)
        while room > 0 and any(left.values()):
            subject = self.turns[0]
            self.turns.rotate(-1)
            if left[subject] > 0:
                dealt.append(subject)
                left[subject] -= 1
                room -= 1
        return dealt

    def _deal_bands(self, waiting: dict[str, int], room: int) -> list[str]:
        """A prioritized lane's deal: a band's subject per job, in the bands' turns
        (`band_of_turn`), from the turn after this feeder's last."""
        assert self.bands is not None
        left = {band: waiting.get(subject, 0) for band, subject in self.bands.items()}
        dealt: list[str] = []
        while room > 0:
            band = band_of_turn(self.turn, lambda band: left[band] > 0)
            if band is None:
                break
            dealt.append(self.bands[band])
            left[band] -= 1
            self.turn += 1
            room -= 1
        return dealt

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
                    f"$JS.API.DIRECT.GET.{self.stream}",
                    json.dumps(request).encode(),
                    reply=reply,
                )
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(GET_TIMEOUT_S):
                    await done.wait()
        finally:
            with contextlib.suppress(*NATS_ERRORS):
                await subscription.unsubscribe()
        return {subject: sorted(msgs, key=_seq) for subject, msgs in found.items()}


def _in_turns(dealt: list[str], taken: dict[str, list[Msg]]) -> list[Msg]:
    """The messages in the order dealt, each subject's oldest first (a subject that gave fewer
    than dealt, another worker having moved some, gives what it has)."""
    left = {subject: iter(msgs) for subject, msgs in taken.items()}
    return [msg for subject in dealt if (msg := next(left[subject], None)) is not None]


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
