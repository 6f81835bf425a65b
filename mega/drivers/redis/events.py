"""The `EventLog` part of the Redis bus (see bus.py)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from mega.constants import CLOSE_TASKS_S
from mega.drivers.base import (
    DEDUP_WINDOW_S,
    DriverUnavailable,
    Message,
)
from mega.drivers.redis.client import (
    OUTAGES,
    queue_script,
)
from mega.drivers.redis.core import RedisCore
from mega.drivers.redis.scripts import (
    EVENT_SUBJECT_PREFIX,
    EVENTS_LOG,
    WAKE_CHANNEL,
)
from mega.tasks import cancel_and_wait


class RedisEventLog(RedisCore):
    """The `EventLog` of the Redis bus."""

    async def ensure_events(self, *, max_age_s: float) -> None:
        return None  # the log is made by its first XADD, or by a group's XGROUP CREATE

    async def emit(self, messages: Sequence[Message], *, max_age_s: float) -> list[bool]:
        """One EMIT per event (dedup key, XADD trimming what is older than `max_age_s`), in one
        pipeline. Every event is deduplicated by its id (ids not given are unique anyway)."""
        oldest_kept = int((time.time() - max_age_s) * 1000) if max_age_s else 0
        try:
            async with self.redis.pipeline(transaction=False) as pipe:
                for message in messages:
                    await queue_script(
                        pipe,
                        self._emit,
                        [EVENTS_LOG, f"{EVENTS_LOG}:dedup:{message.id}"],
                        [
                            message.id,
                            EVENT_SUBJECT_PREFIX + message.subject,
                            message.body,
                            message.enqueued_at_ms,
                            oldest_kept,
                            DEDUP_WINDOW_S,
                            json.dumps(message.trace) if message.trace else "",
                        ],
                    )
                answers: list[Any] = await pipe.execute()
        except OUTAGES as exc:
            raise DriverUnavailable(f"cannot emit on {self.alias!r}: {exc}") from exc
        return [answer == 1 for answer in answers]

    async def watch_commits(self, wake: Callable[[], None]) -> Callable[[], Awaitable[None]]:
        pubsub = self.redis.pubsub()

        async def watch() -> None:
            while True:
                try:
                    if not pubsub.subscribed:
                        await pubsub.subscribe(WAKE_CHANNEL)
                    message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=1)
                    if message is not None:
                        wake()
                except OUTAGES:  # away: the relay polls meanwhile
                    await asyncio.sleep(1)

        task = asyncio.create_task(watch(), name="mega-outbox-watch")

        async def stop() -> None:
            await cancel_and_wait([task], CLOSE_TASKS_S)
            with contextlib.suppress(*OUTAGES):
                await pubsub.aclose()  # type: ignore[no-untyped-call]

        return stop

    def announce_commit(self) -> None:
        async def publish() -> None:
            with contextlib.suppress(*OUTAGES):
                await self.redis.publish(WAKE_CHANNEL, b"")

        task = asyncio.create_task(publish())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
