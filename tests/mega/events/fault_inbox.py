"""Listener groups for tests/mega/events/test_inbox_faults.py, run by real `mega worker`
processes that the test SIGKILLs in turn. Names and keys carry FAULT_PREFIX from the
environment, so every test has its own.

    DbLedger     inbox = "db": its effect is a row of `fault_effects`, in the delivery's transaction
    RedisTally   inbox = "main": its effect is `HINCRBY <prefix>:effects <event id> 1`, made with
                 event.inbox.apply

Each run first counts itself in `<prefix>:runs:<group>` (event id -> runs started), outside any
transaction: a run cut short by a kill and started again shows there, never in the effects.
"""

from __future__ import annotations

import asyncio
import os

from sqlalchemy import Column, Integer, MetaData, String, Table, insert

from mega import Context, Event, Listener, ReceivedEvent

PREFIX = os.environ.get("FAULT_PREFIX", "faults")
# Each run waits this long before its effect, so that a kill finds runs in flight.
RUN_S = 0.01

EFFECTS = Table(
    "fault_effects",
    MetaData(),
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("event_id", String(255), nullable=False),  # not unique: a repeat would show
)


class Happened(Event):
    name = f"{PREFIX}.happened"
    bus = "jobs"


class Killed(Listener):
    """A group whose workers die often: short ack wait, and attempts enough that an event
    interrupted by several kills is never dead-lettered."""

    event = Happened
    concurrency = 10
    ack_wait_s = 2.0
    retries = 20
    backoff = {"type": "exponential", "initial": 10, "max": 10}

    async def started(self, event: ReceivedEvent, ctx: Context) -> str:
        """Count this run; the test's prefix (the event's, also where FAULT_PREFIX is unset)."""
        prefix = event.name.split(".", 1)[0]
        await ctx.cache("main").native.hincrby(f"{prefix}:runs:{self.group}", event.id, 1)
        await asyncio.sleep(RUN_S)
        return prefix


class DbLedger(Killed):
    group = f"{PREFIX}-ledger"
    inbox = "db"

    async def run(self, event: ReceivedEvent, ctx: Context) -> None:
        await self.started(event, ctx)
        await event.db.run(lambda session: session.execute(insert(EFFECTS), {"event_id": event.id}))


class RedisTally(Killed):
    group = f"{PREFIX}-tally"
    inbox = "main"

    async def run(self, event: ReceivedEvent, ctx: Context) -> None:
        prefix = await self.started(event, ctx)
        await event.inbox.apply(event.id, ("HINCRBY", f"{prefix}:effects", event.id, 1))
