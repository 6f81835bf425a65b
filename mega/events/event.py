"""`Event`, the class users declare events with, and its `emit`.

    class UserSignedUp(Event):
        name = "user.signed_up"
        bus = "jobs"

    await UserSignedUp.emit(ctx, {"email": "ada@example.com"})   # now, once the bus has it

What an event declares and how it is checked is in mega/events/spec.py (EventBase); emitting
goes through the EventBus kept on the context (mega/events/bus.py).
"""

from __future__ import annotations

from typing import Any

from mega.context import Context
from mega.events.bus import bus_of
from mega.events.spec import EventBase


class Event(EventBase):
    """Base class of every event. Subclasses set `name` and `bus`; `schema` is optional."""

    @classmethod
    async def emit(cls, ctx: Context, payload: Any = None, *, id: str | None = None) -> str:
        """Publish one of this event now on its bus, and return its id once the bus stored it.

        Args:
            ctx: the host's context, or a run's.
            payload: JSON, or the event's `schema` (checked here: EventError
                `event.invalid_payload`).
            id: the event's id and dedup key (default a random one): the same id within the
                bus's dedup window is stored once.

        For an event that records a change your code writes to the database, use
        `outbox.add(session, ...)` in that transaction instead: then it leaves only if the
        change commits, and always does once it has."""
        return await bus_of(ctx, cls.bus).emit(cls, payload, id=id)
