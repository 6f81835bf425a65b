"""EventBus: emit the events of one bus alias and run its listener groups, on any driver.

    bus = EventBus(ctx, "jobs")
    await bus.emit(UserSignedUp, {"user_id": 7})     # for code with no database write to pair
    await bus.listen(WelcomeEmailListener)            # the group's consume loop, until stop()

The driver of the bus (`ctx.bus(alias)`, see mega/drivers) keeps the events for replay
(`max_age_s`, a week by default) and one cursor per listener group: every group hears every
event its pattern matches, and the processes of one group share them. Listeners run in the
jobs' consume loop (mega/lanes/consumer.py): retries with backoff, dead letters, lease
heartbeats and the drain are the jobs' own. Signals: `emit` (an event was stored), `start`,
`done`, `retry`, `fail`, `dlq` (as for jobs, with `group` instead of `job`) and `skip` (the
group's inbox had already completed that event id).

A group's `inbox` decides what surrounds `run`: nothing; a cache alias (mega/events/inbox.py:
the mark is checked before and set after, and `event.inbox.apply` sets it with a Redis effect);
or "db" (mega/events/db_inbox.py: `run` inside a transaction committed with the mark).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any, ClassVar

from mega import tracing
from mega.context import Context
from mega.drivers.base import Delivery, DriverUnavailable, Lane, LaneStats, Message
from mega.errors import EventError, JobError
from mega.events.inbox import Inbox
from mega.events.listener import DB_INBOX, Listener, ListenerSpec, validate_listener
from mega.events.spec import (
    EVENTS_MAX_AGE_S,
    EventBase,
    ReceivedEvent,
    encode_event,
    validate_event,
)
from mega.lanes.declaration import check_engine_cap, threaded
from mega.lanes.dlq import DeadLetters
from mega.lanes.endpoint import LaneEndpoint
from mega.lanes.executor import Handler
from mega.lanes.presence import WorkerSeen

if TYPE_CHECKING:
    from mega.events.db_inbox import InboxTransaction

SIGNALS = ("emit", "start", "done", "retry", "fail", "dlq", "skip")


def group_lane(spec: ListenerSpec) -> Lane:
    """What a driver needs to know of a listener group."""
    return Lane(
        kind="group",
        name=spec.group,
        subject=spec.pattern,
        concurrency=spec.concurrency,
        ack_wait_s=spec.ack_wait_s,
        dlq_max_age_s=spec.dlq_max_age_s,
        replicas=spec.replicas,
    )


class EventBus(LaneEndpoint):
    """Emit the events of one bus alias and run its listener groups in this process; an Event
    or a Listener does not change when its bus changes driver. Observers as LaneEndpoint's
    (mega/lanes/endpoint.py), with the signals of SIGNALS.
    """

    signal_names: ClassVar[tuple[str, ...]] = SIGNALS
    kind: ClassVar[str] = "event"
    error: ClassVar[type[JobError]] = EventError

    def __init__(
        self, ctx: Context, bus_alias: str, *, max_age_s: float = EVENTS_MAX_AGE_S, **options: Any
    ) -> None:
        """The events and listener groups of one bus alias in this process.

        Args:
            ctx: the host's context.
            bus_alias: a bus alias of the config (ConfigError naming it otherwise).
            max_age_s: how long events are kept for replay, in seconds (default a week); it
                applies when this bus makes what keeps its events, which is never changed once
                made.
            **options: LaneEndpoint's (mega/lanes/endpoint.py): `instance_id` names this
                process in DLQ records (default the context's), `apply_limits` lets the
                classes' limits change running groups (the worker's `--apply-limits`), and
                `dlq_retry_delay_s`.
        """
        super().__init__(ctx, bus_alias, **options)
        self.max_age_s = max_age_s
        self._events_ready = False

    async def signal(self, name: str, **fields: Any) -> None:
        """Notify observers (skipped when nobody listens).

        Args:
            name: one of SIGNALS.
            **fields: what the signal says; the consume loop's `job` is sent as `group`.
        """
        if self.signals.has_observers(name):
            if "job" in fields:  # the consume loop names what it runs `job`: here, a group
                fields["group"] = fields.pop("job")
            await self.signals.emit(name, **fields)

    def spec(self, listener_cls: type[Listener]) -> ListenerSpec:
        """The validated spec of a Listener class on this bus (cached).

        Args:
            listener_cls: the Listener class; RegistrationError names each bad attribute, and
                EventError `event.wrong_bus` says it is on another bus.
        """
        return self.declared(
            listener_cls,
            lambda cls: validate_listener(
                cls, self.ctx.buses, self.ctx.caches, database=self.ctx.has_database
            ),
        )

    @property
    def dlq(self) -> DeadLetters:
        """DLQ tools (list, count, requeue, purge) over the listener groups of this bus."""
        return DeadLetters(self.bus, self._ensured_lane)

    async def _ensured_lane(self, listener_cls: type[Any]) -> Lane:
        return group_lane(await self.ensure(listener_cls))

    @property
    def connected(self) -> bool:
        """Whether a publish can reach the bus now (the relay waits while it cannot)."""
        return self.bus.connected

    async def ensure_stream(self) -> None:
        """Make what keeps this bus's events exist (never changes it once made)."""
        if self._events_ready:
            return
        try:
            await self.bus.ensure_events(max_age_s=self.max_age_s)
        except DriverUnavailable as exc:
            raise self.unavailable("cannot set up the events", exc) from exc
        self._events_ready = True

    async def ensure(self, listener_cls: type[Listener], *, force: bool = False) -> ListenerSpec:
        """The events and the group's cursor and dead letters, where missing.

        Args:
            listener_cls: the Listener class, on this bus.
            force: ask the bus again, for the events too, even when this bus has already set
                the group up in this process (default False: once per process).
        """
        spec = self.spec(listener_cls)
        if listener_cls in self._ensured and not force:
            return spec
        if force:
            self._events_ready = False
        await self.ensure_stream()
        what = f"{spec.group}: cannot set up its consumer"
        await self.ensure_lane(listener_cls, group_lane(spec), what, force=force)
        return spec

    async def stats(self, listener_cls: type[Listener]) -> LaneStats:
        """The group's backlog right now: pending, in flight, dead letters.

        Args:
            listener_cls: the Listener class, on this bus (its group is set up first if need
                be).
        """
        spec = await self.ensure(listener_cls)
        return await self.lane_stats(group_lane(spec), f"cannot read {spec.group}")

    async def workers(self, listener_cls: type[Listener]) -> list[WorkerSeen]:
        """The group's consume loops seen within the last 30 s, the last seen first (as
        `JobQueue.workers`).

        Args:
            listener_cls: the Listener class, on this bus (its group is set up first if need
                be).
        """
        spec = await self.ensure(listener_cls)
        return await self.lane_workers(group_lane(spec), f"cannot read {spec.group}'s workers")

    # -- emit ---------------------------------------------------------------------------------

    async def emit(self, event_cls: type[EventBase], payload: Any, *, id: str | None = None) -> str:
        """Publish one event now and return its id once the bus has stored it.

        For code with no database write to pair it with; otherwise use the outbox, so that the
        event exists if and only if the transaction commits. Raises EventError
        `event.invalid_payload` (nothing published) or DependencyUnavailable.

        Args:
            event_cls: the Event class; it is published on this bus.
            payload: JSON, or the event's `schema`.
            id: the dedup key (default a random one); one given is 1-200 printable characters
                without spaces (else EventError `event.invalid_id`).
        """
        spec = validate_event(event_cls, self.ctx.buses)
        message = encode_event(spec, payload, event_id=id)
        if tracing.tracer() is None:
            await self.publish(message)
            return message.id
        ids = [message.id]
        with tracing.producing("publish", spec.name, system=self.bus.driver, ids=ids) as trace:
            await self.publish(replace(message, trace=trace))
        return message.id

    async def publish(self, message: Message) -> bool:
        """Publish an encoded event; True when the bus kept it, False when it was a duplicate
        (an id it already has within the dedup window).

        Args:
            message: the event as `encode_event` builds it (mega/events/spec.py).
        """
        check_engine_cap(message.subject, [message.body], self.bus, "event", EventError)
        await self.ensure_stream()
        try:
            [kept] = await self.bus.emit([message], max_age_s=self.max_age_s)
        except DriverUnavailable as exc:
            raise self.unavailable(f"cannot emit {message.subject}", exc) from exc
        await self.signal("emit", event=message.subject, id=message.id, duplicate=not kept)
        return kept

    async def publish_many(self, messages: list[Message]) -> None:
        """Publish encoded events in order and return once the bus has stored every one (the
        relay's path: duplicates are dropped silently). Raises DriverUnavailable.

        Args:
            messages: the events as `encode_event` builds them, in the order they go out.
        """
        await self.ensure_stream()
        await self.bus.emit(messages, max_age_s=self.max_age_s)

    async def watch_commits(self, wake: Callable[[], None]) -> Callable[[], Awaitable[None]]:
        """Call `wake()` when another process announces an outbox commit; returns the stop.

        Args:
            wake: a plain function of no arguments, called on the event loop; it should only
                wake its caller (the relay's sets its wake-up event).
        """
        return await self.bus.watch_commits(wake)

    def announce_commit(self) -> None:
        """Tell the relays of other processes that outbox rows were committed."""
        self.bus.announce_commit()

    # -- listen -------------------------------------------------------------------------------

    async def consume(
        self, listener_cls: type[Listener], handler_ctx: Context | None = None
    ) -> None:
        """Run the group's consume loop in this process until `stop()` has drained it
        (`listen` is the same call).

        Args:
            listener_cls: the Listener class, on this bus.
            handler_ctx: what `run(event, ctx)` receives (None, the default: the bus's
                context).
        """
        spec = await self.ensure(listener_cls)
        run = self._runner(spec, handler_ctx or self.ctx)
        await self.run_lane(listener_cls, group_lane(spec), spec, run)

    listen = consume

    def _runner(self, spec: ListenerSpec, ctx: Context) -> Handler:
        """What runs one delivery of an event: `run` (on a thread when it is a plain `def`),
        within the group's inbox if it has one."""
        listener_run = threaded(spec.listener_cls().run, spec.concurrency)
        if spec.inbox == DB_INBOX:
            return self._transactional_runner(spec, listener_run, ctx)
        inbox = (
            Inbox(ctx.cache(spec.inbox).native, spec.group, spec.inbox_ttl_s)
            if spec.inbox
            else None
        )

        async def run(payload: Any, delivery: Delivery) -> None:
            if inbox is not None and await inbox.seen(delivery.id):
                await self._skipped(spec, delivery)
                return
            await listener_run(received(payload, delivery, cache_inbox=inbox), ctx)
            if inbox is not None:
                await inbox.mark(delivery.id)

        return run

    def _transactional_runner(
        self, spec: ListenerSpec, listener_run: Callable[..., Awaitable[Any]], ctx: Context
    ) -> Handler:
        """`run` inside a database transaction that commits the group's mark of the event id."""
        # Imported here: the database inbox needs SQLAlchemy, which a config whose listeners
        # never use it (and a command that only reads the config) has no need to import.
        from mega.events.db_inbox import DbInbox

        inbox = DbInbox(ctx.db, spec.group, spec.inbox_ttl_s)

        async def run(payload: Any, delivery: Delivery) -> None:
            async def within(transaction: InboxTransaction) -> None:
                event = received(payload, delivery, db_transaction=transaction)
                await listener_run(event, ctx)

            if not await inbox.deliver(delivery.id, within):
                await self._skipped(spec, delivery)
                return
            await inbox.prune_now_and_then()

        return run

    async def _skipped(self, spec: ListenerSpec, delivery: Delivery) -> None:
        await self.signal("skip", group=spec.group, id=delivery.id, attempt=delivery.attempt)


def received(
    payload: Any,
    delivery: Delivery,
    *,
    db_transaction: InboxTransaction | None = None,
    cache_inbox: Inbox | None = None,
) -> ReceivedEvent:
    """The event a listener's `run` receives for one delivery."""
    return ReceivedEvent(
        id=delivery.id,
        name=delivery.subject,
        data=payload,
        emitted_at=delivery.enqueued_at_ms,
        attempt=delivery.attempt,
        db_transaction=db_transaction,
        cache_inbox=cache_inbox,
    )


def bus_of(ctx: Context, alias: str) -> EventBus:
    """The EventBus of `alias` that `Event.emit` uses, made once per context."""
    key = (EventBus, alias)
    bus = ctx.memo.get(key)
    if bus is None:
        bus = ctx.memo[key] = EventBus(ctx, alias)
    assert isinstance(bus, EventBus)
    return bus


async def emit(
    ctx: Context, event_cls: type[EventBase], payload: Any, *, id: str | None = None
) -> str:
    """`event_cls.emit(ctx, payload, id=id)`, for an event class declared on `EventBase`."""
    return await bus_of(ctx, event_cls.bus).emit(event_cls, payload, id=id)
