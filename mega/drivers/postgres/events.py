"""The `EventLog` part of the Postgres bus (see bus.py)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING

from mega.drivers.base import (
    DriverUnavailable,
    Message,
)
from mega.drivers.postgres import schema, sql
from mega.drivers.postgres.core import PostgresCore, each_row

if TYPE_CHECKING:
    pass


class PostgresEventLog(PostgresCore):
    """The `EventLog` of the Postgres bus."""

    async def ensure_events(self, *, max_age_s: float) -> None:
        """The tables, where missing; events older than `max_age_s` are pruned by the groups'
        receivers (0: kept forever)."""
        self.events_max_age_s = max_age_s
        async with self._using("cannot set up the events log") as connection:
            await self.ensure_schema(connection)

    async def emit(self, messages: Sequence[Message], *, max_age_s: float) -> list[bool]:
        """Appended under the emit lock (see sql.EMIT_LOCK), so that seq order is commit
        order: emits of all processes queue there for the length of one short transaction."""
        if not messages:
            return []
        self.events_max_age_s = max_age_s
        params = [
            {
                "event_id": message.id,
                "name": message.subject,
                "body": message.body,
                "emitted_at_ms": message.enqueued_at_ms,
                "trace": sql.trace_text(message.trace),
            }
            for message in messages
        ]
        async with (
            self._using("cannot emit") as connection,
            connection.transaction(),
            connection.cursor() as cursor,
        ):
            await cursor.execute(sql.EMIT_LOCK)
            kept = await each_row(cursor, sql.EMIT, params)
            if any(kept):
                await cursor.execute(
                    sql.NOTIFY, {"channel": schema.WAKE_CHANNEL, "payload": schema.EVENTS_PAYLOAD}
                )
        return kept

    async def watch_commits(self, wake: Callable[[], None]) -> Callable[[], Awaitable[None]]:
        """`wake()` at each NOTIFY on mega_outbox_wake (heard by the bus's LISTEN connection)."""
        self._commit_watchers.add(wake)

        async def stop() -> None:
            self._commit_watchers.discard(wake)

        return stop

    def announce_commit(self) -> None:
        async def notify() -> None:
            with contextlib.suppress(DriverUnavailable):
                async with self._using("announce") as connection:
                    await connection.execute(
                        sql.NOTIFY, {"channel": schema.OUTBOX_CHANNEL, "payload": ""}
                    )

        task = asyncio.create_task(notify())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
