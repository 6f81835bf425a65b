"""An event is a class: a fact that already happened ("user.signed_up"), with a `name`, the `bus`
it travels on and, optionally, a pydantic `schema` its payload is validated against at emit.

    class UserSignedUp(Event):
        name = "user.signed_up"
        bus = "jobs"
        schema = SignupPayload          # optional: a pydantic model

A job is work someone asked for (one consumer group does it once); an event is news (every
listener group hears it). The events of a bus are kept `EVENTS_MAX_AGE_S` (a week) for replay:
a new listener group starts from the oldest kept.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Annotated, Any, ClassVar

from pydantic import (
    BaseModel,
    Field,
    StrictInt,
    StrictStr,
    ValidationError,
    ValidationInfo,
    field_validator,
)

from mega import clock
from mega.declaration import Declaration, declared_alias, matching, rule, validate_subclass
from mega.drivers.base import Message
from mega.errors import EventError
from mega.lanes.declaration import json_body
from mega.validation import MAX_ID_LENGTH, MAX_PAYLOAD_BYTES, is_token, shortened

if TYPE_CHECKING:
    from mega.events.db_inbox import InboxTransaction
    from mega.events.inbox import Inbox

# Event names: letters, digits, `_` and `-` in non-empty tokens joined by dots, like job subjects.
NAME_RE = re.compile(r"[A-Za-z0-9_-]+(?:\.[A-Za-z0-9_-]+)*")
NAME_RULE = "letters, digits, '.', '_' and '-' only"
# Events are kept this long for replay (a new listener group starts from the oldest kept).
EVENTS_MAX_AGE_S = 7 * 24 * 3600


class EventBase:
    """What an event declares: its `name`, its `bus`, an optional `schema` and its payload cap.
    Declare events as subclasses of `mega.Event` (mega/events/event.py), which adds `emit`."""

    name: ClassVar[str]
    bus: ClassVar[str]
    schema: ClassVar[type[BaseModel] | None] = None
    max_payload_bytes: ClassVar[int] = MAX_PAYLOAD_BYTES


@dataclass(frozen=True)
class EventSpec:
    """A validated Event class."""

    event_cls: type[EventBase]
    name: str
    bus: str
    schema: type[BaseModel] | None
    max_payload_bytes: int = MAX_PAYLOAD_BYTES


@dataclass(frozen=True)
class ReceivedEvent:
    """What a listener's `run(event, ctx)` receives: the event as emitted, which delivery of it
    this is (1 the first time; more after a retry or a crash), and the group's inbox: `db`
    (inbox = "db") or `inbox` (inbox = a cache alias)."""

    id: str
    name: str
    data: Any
    emitted_at: int | None  # epoch ms
    attempt: int
    # Set by the event bus for each delivery, from the group's `inbox`.
    db_transaction: InboxTransaction | None = field(
        default=None, kw_only=True, repr=False, compare=False
    )
    cache_inbox: Inbox | None = field(default=None, kw_only=True, repr=False, compare=False)

    @property
    def db(self) -> InboxTransaction:
        """This delivery's database transaction, committed with the event id once `run`
        returns: `await event.db.run(lambda session: ...)`. Only with `inbox = "db"`."""
        if self.db_transaction is None:
            raise EventError(
                f'{self.name}: event.db is the transaction of a group with inbox = "db", and '
                "this group has another inbox or none",
                code="event.no_inbox",
            )
        return self.db_transaction

    @property
    def inbox(self) -> Inbox:
        """The group's inbox in Redis, for effects there: `await event.inbox.apply(event.id,
        ("HINCRBY", key, field, 1))`. Only with `inbox = "<cache alias>"`."""
        if self.cache_inbox is None:
            raise EventError(
                f"{self.name}: event.inbox is the Redis inbox of a group with inbox = "
                '"<cache alias>", and this group has another inbox or none',
                code="event.no_inbox",
            )
        return self.cache_inbox


class EventDeclaration(Declaration):
    """The class attributes of an Event, in the order its problems are reported."""

    name: Annotated[StrictStr, matching(NAME_RE), rule(NAME_RULE)]
    bus: str
    # `schema` would shadow a BaseModel attribute: the field takes the attribute's name as alias.
    payload_schema: Annotated[
        type[BaseModel] | None, rule("must be a pydantic model class or None")
    ] = Field(alias="schema")
    max_payload_bytes: Annotated[
        StrictInt, Field(ge=1), rule("must be a positive int: the payload's bytes as JSON")
    ]

    @field_validator("bus", mode="before")
    @classmethod
    def _declared_bus(cls, bus: object, info: ValidationInfo) -> str:
        return declared_alias(bus, "bus", info)


def validate_event(event_cls: type[EventBase], bus_aliases: Collection[str]) -> EventSpec:
    """Check an Event class at once; RegistrationError lists each bad field."""
    context = {"bus_aliases": bus_aliases}
    event = validate_subclass(EventDeclaration, event_cls, EventBase, "event", context)
    return EventSpec(
        event_cls, event.name, event.bus, event.payload_schema, event.max_payload_bytes
    )


def encode_event(
    spec: EventSpec, payload: Any, *, event_id: str | None = None, emitted_at_ms: int | None = None
) -> Message:
    """Validate the payload (against `schema`, then as JSON) and build the message.

    The event id is its dedup key, so a second publish of the same event within the bus's
    dedup window is dropped. Raises EventError `event.invalid_id` or `event.invalid_payload`."""
    if event_id is not None and not is_token(event_id):
        raise EventError(
            f"{spec.name}: id must be 1-{MAX_ID_LENGTH} printable characters without spaces, "
            f"got {shortened(event_id)}",
            code="event.invalid_id",
        )
    if spec.schema is not None:
        try:
            payload = spec.schema.model_validate(payload).model_dump(mode="json")
        except ValidationError as exc:
            raise EventError(
                f"{spec.name}: payload does not match {spec.schema.__name__}: {exc}",
                code="event.invalid_payload",
            ) from None
    body = json_body(spec.name, payload, "event", spec.max_payload_bytes, EventError)
    event_id = event_id or uuid.uuid4().hex
    emitted = emitted_at_ms if emitted_at_ms is not None else clock.now_ms()
    return Message(event_id, spec.name, body, emitted)
