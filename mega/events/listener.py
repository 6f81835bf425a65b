"""A listener is a class: which events it hears (`event`), the group it belongs to (`group`), how
it is run (`concurrency`, `retries`, `backoff`, `ack_wait_s`) and what it does
(`async def run(self, event, ctx)`).

    class WelcomeEmailListener(Listener):
        event = UserSignedUp            # or a pattern of names: "user.*", "user.>"
        retries = 2
        inbox = "main"                  # skip an event id this group already completed

        async def run(self, event: ReceivedEvent, ctx: Context) -> None:
            await JobQueue(ctx, "jobs").enqueue(EmailJob, {...}, id=f"welcome-{event.id}")

Fan-out: every group receives every event it listens to; the processes of one group share them
(one cursor per group over the bus's events). A failure retries with backoff and then
lands in the group's own dead letters, exactly as a job does (the same consume loop).
Delivery is at-least-once: make `run` idempotent, or let the inbox skip completed ids. An
inbox in Redis (`inbox = "<cache alias>"`) narrows the window of a repeat; `inbox = "db"` closes
it for database effects (mega/events/db_inbox.py), and `event.inbox.apply` for Redis effects
(mega/events/inbox.py).
"""

from __future__ import annotations

import re
from collections.abc import Collection
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, ClassVar

from pydantic import StrictStr, ValidationInfo, field_validator

from mega.declaration import PositiveInt, declared_alias, matching, rule, validate_subclass
from mega.events.spec import EventBase, ReceivedEvent
from mega.lanes.declaration import Consumed, ConsumedDeclaration, ConsumedSpec
from mega.lanes.ratelimit import RateLimit

if TYPE_CHECKING:
    from mega.context import Context

# A pattern of event names: tokens joined by dots, where `*` matches one token and a final `>`
# the rest (NATS subject wildcards).
PATTERN_RE = re.compile(r"(?:[A-Za-z0-9_-]+|\*)(?:\.(?:[A-Za-z0-9_-]+|\*))*(?:\.>)?|>")
GROUP_RE = re.compile(r"[A-Za-z0-9_-]+")
# The inbox remembers a completed event id this long: longer than the events are kept.
DEFAULT_INBOX_TTL_S = 14 * 24 * 3600
# `inbox = "db"`: the transactional inbox, in the database of services.database (so a cache
# alias "db" cannot hold an inbox).
DB_INBOX = "db"


class Listener(Consumed):
    """Base class of every listener. Subclasses set `event` and override `run`.

    Class attributes: `event` (an Event class, or a name pattern with `*` / `>`), `group`
    (default the class name; letters, digits, `_`, `-`), `bus` (default the Event class's; a
    pattern needs it), `concurrency` (>= 1, for the whole group), `retries` (>= 0),
    `backoff` (exponential, ms), `ack_wait_s` (> 0), `dlq_max_age_s` (>= 0, 0 keeps forever),
    `inbox` (None; a cache alias where the group remembers completed event ids for
    `inbox_ttl_s` seconds and skips them when they come again, and `event.inbox.apply` makes an
    effect in that Redis with the mark; or "db": each delivery runs in a
    database transaction, `event.db`, committed with the event id), `replicas` (1 to 5: copies
    of its DLQ stream in a NATS cluster; the events stream's are the bus's `replicas`).
    """

    event: ClassVar[type[EventBase] | str]
    group: ClassVar[str]
    bus: ClassVar[str | None] = None
    inbox: ClassVar[str | None] = None
    inbox_ttl_s: ClassVar[int] = DEFAULT_INBOX_TTL_S

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        if "group" not in cls.__dict__:
            cls.group = cls.__name__

    # Declared plain (returning Any) so that both `async def run` and a plain `def run` type
    # check as overrides.
    def run(self, event: ReceivedEvent, ctx: Context) -> Any:
        """Handle one event. Raise to fail this attempt (it is retried, then dead-lettered).
        A plain `def run` runs on a worker thread, at most `concurrency` at once.

        Args:
            event: the event heard: its id, name and data (the payload as JSON), when it was
                emitted, which delivery of it this is, and the group's inbox if it has one.
            ctx: the host's context, or the one given to `EventBus.consume`.
        """
        raise NotImplementedError


@dataclass(frozen=True, kw_only=True)
class ListenerSpec(ConsumedSpec):
    """A validated Listener class with everything the event bus derives from it."""

    listener_cls: type[Listener]
    group: str
    bus: str
    pattern: str  # event names, with NATS wildcards
    inbox: str | None
    inbox_ttl_s: int

    @property
    def name(self) -> str:
        return self.group


GROUP_RULE = "letters, digits, '_' and '-' only"
EVENT_RULE = "an Event class or a name pattern such as 'user.*'"


class ListenerDeclaration(ConsumedDeclaration):
    """The class attributes of a Listener."""

    base_run: ClassVar[object] = Listener.run
    run_signature: ClassVar[str] = "(self, event, ctx)"

    event: Annotated[type[EventBase] | Annotated[StrictStr, matching(PATTERN_RE)], rule(EVENT_RULE)]
    bus: str
    group: Annotated[StrictStr, matching(GROUP_RE), rule(GROUP_RULE)]
    inbox_ttl_s: PositiveInt
    inbox: str | None

    @field_validator("rate_limit")
    @classmethod
    def _of_the_group(cls, limit: RateLimit | None) -> RateLimit | None:
        if limit is not None and limit.per == "key":
            raise ValueError('"per": "key" is for jobs: an event carries no key')
        return limit

    @field_validator("bus", mode="before")
    @classmethod
    def _declared_bus(cls, bus: object, info: ValidationInfo) -> str:
        # An Event class says its bus; a pattern needs the listener's.
        event = info.data.get("event")
        if not bus and isinstance(event, type):
            bus = getattr(event, "bus", None)
        return declared_alias(bus, "bus", info)

    @field_validator("inbox", mode="before")
    @classmethod
    def _declared_inbox(cls, inbox: object, info: ValidationInfo) -> str | None:
        if inbox is None:
            return None
        if inbox == DB_INBOX:
            if not (info.context or {}).get("database"):
                raise ValueError(
                    '"db" keeps the inbox in the database, and none is configured '
                    "(services.database)"
                )
            return DB_INBOX
        try:
            return declared_alias(inbox, "cache", info)
        except ValueError as exc:
            raise ValueError(f'{exc}, or "db" for the database') from None


def validate_listener(
    listener_cls: type[Listener],
    bus_aliases: Collection[str],
    cache_aliases: Collection[str],
    *,
    database: bool = False,
) -> ListenerSpec:
    """Check every attribute of a Listener class at once; RegistrationError lists each one.
    `database`: whether a database is configured (`inbox = "db"` needs one)."""
    context = {"bus_aliases": bus_aliases, "cache_aliases": cache_aliases, "database": database}
    listener = validate_subclass(ListenerDeclaration, listener_cls, Listener, "listener", context)
    event = listener.event
    return ListenerSpec(
        listener_cls=listener_cls,
        group=listener.group,
        bus=listener.bus,
        pattern=event if isinstance(event, str) else getattr(event, "name", ""),
        inbox=listener.inbox,
        inbox_ttl_s=listener.inbox_ttl_s,
        **listener.consumed(),
    )
