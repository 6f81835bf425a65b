"""The events of a NATS bus: one stream, `mega_events`, that listener groups read through
consumers of their own; and the outbox's notifier on a core NATS subject."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any

from nats.aio.msg import Msg
from nats.js.api import (
    RetentionPolicy,
    StorageType,
    StreamConfig,
)

from mega.drivers.base import (
    DEDUP_WINDOW_S,
    Message,
)
from mega.drivers.nats.core import NatsCore, ensure_stream
from mega.drivers.nats.errors import NATS_ERRORS
from mega.drivers.nats.names import (
    EVENT_PREFIX,
    EVENTS_STREAM,
    HEADER_EMITTED_AT,
    NATS_MSG_ID,
    REQUEUE_PREFIX,
)

# How long a batch of events (the outbox relay's) waits for its PubAcks before it gives up
# (the rows stay pending). On SQLite writers wait for the relay's transaction meanwhile.
EVENTS_TIMEOUT_S = 2.0
# A commit that added outbox rows in another process says so here (core NATS, fire and
# forget), so relays wake at once wherever the row was written; their poll is the fallback.
WAKE_SUBJECT = "mega.outbox.wake"


class NatsEventLog(NatsCore):
    """The `EventLog` part of the NATS bus."""

    async def ensure_events(self, *, max_age_s: float) -> None:
        self._events_max_age_s = max_age_s
        config = StreamConfig(
            name=EVENTS_STREAM,
            subjects=[EVENT_PREFIX + ">", REQUEUE_PREFIX + ">"],
            retention=RetentionPolicy.LIMITS,
            storage=StorageType.FILE,
            max_age=max_age_s or None,
            duplicate_window=DEDUP_WINDOW_S,
            # A group's retries wait as schedules on `events_requeue.<group>._delay.*`.
            allow_msg_schedules=True if self.schedules_supported else None,
            num_replicas=self.spec.replicas,
        )
        await self.patiently(EVENTS_STREAM, lambda: ensure_stream(self.js, config))

    async def emit(self, messages: Sequence[Message], *, max_age_s: float) -> list[bool]:
        self._check_connected()
        envelopes = [
            (
                EVENT_PREFIX + m.subject,
                m.body,
                {NATS_MSG_ID: m.id, HEADER_EMITTED_AT: str(m.enqueued_at_ms), **(m.trace or {})},
            )
            for m in messages
        ]
        return await self.publish_envelopes(envelopes, timeout_s=EVENTS_TIMEOUT_S)

    async def watch_commits(self, wake: Callable[[], None]) -> Callable[[], Awaitable[None]]:
        async def woken(msg: Msg) -> None:
            wake()

        try:
            subscription = await self.native.subscribe(WAKE_SUBJECT, cb=woken)
        except NATS_ERRORS:  # not connected now: the relay polls meanwhile
            return _not_watching

        async def unsubscribe() -> None:
            with contextlib.suppress(*NATS_ERRORS):
                await subscription.unsubscribe()

        return unsubscribe

    def announce_commit(self) -> None:
        async def publish() -> None:
            with contextlib.suppress(*NATS_ERRORS):
                await self.native.publish(WAKE_SUBJECT, b"")

        _fire_and_forget(publish())


_background: set[asyncio.Task[None]] = set()  # keeps fire-and-forget tasks alive


def _fire_and_forget(coro: Coroutine[Any, Any, None]) -> None:
    task = asyncio.get_running_loop().create_task(coro)
    _background.add(task)
    task.add_done_callback(_background.discard)


async def _not_watching() -> None:
    return None
