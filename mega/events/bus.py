"""EventBus: the events stream of one bus alias, `emit`, and the listener groups' consume loops.
Below, the `nats` driver; `redis` and `memory` are redis_bus.py and memory_bus.py.

Stream (created by `ensure_stream`, never modified once it exists):
    MEGA_EVENTS  limits retention (file storage, kept `max_age_s`, 7 days by default) on
                 `events.>` (every event) and `events_requeue.>` (a group's requeued events)
and, per listener group, one durable pull consumer `mega_group_<group>` filtered on the
group's event pattern and its requeue subject, plus a dead-letter stream
`MEGA_EVENTS_<GROUP>_DLQ` on `events_dlq.<group>`. A new group starts from the oldest event
the stream keeps (it replays them).

Listeners run in the job consume loop (`mega.jobs.consumer`): retries with backoff, dead
letters, lease heartbeats and the drain are the jobs' own. Signals: `emit` (an event was
published), `start`, `done`, `retry`, `fail`, `dlq` (as for jobs, with `group` instead of
`job`) and `skip` (the group's inbox had already completed that event id).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import importlib
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, ClassVar

from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import (
    AckPolicy,
    ConsumerConfig,
    DeliverPolicy,
    RetentionPolicy,
    StorageType,
    StreamConfig,
)

from mega.context import Context
from mega.errors import DependencyUnavailable, JobError
from mega.events.event import (
    EVENTS_MAX_AGE_S,
    EVENTS_STREAM,
    HEADER_EMITTED_AT,
    HEADER_EVENT_NAME,
    REQUEUE_PREFIX,
    SUBJECT_PREFIX,
    Event,
    EventMessage,
    ReceivedEvent,
    encode_event,
    validate_event,
)
from mega.events.inbox import Inbox
from mega.events.listener import Listener, ListenerSpec, validate_listener
from mega.jobs.consumer import NATS_ERRORS, _Consumer, schedules_supported
from mega.jobs.dlq import DeadLetters
from mega.jobs.queue import (
    DEDUP_WINDOW_S,
    DeadLetterTools,
    JobStats,
    dlq_stream_config,
    ensure_consumer,
    ensure_stream,
)
from mega.signals import Observer, Signals

SIGNALS = ("emit", "start", "done", "retry", "fail", "dlq", "skip")
# An exhausted event whose DLQ record cannot be written comes back after this long.
DLQ_RETRY_DELAY_S = 5.0
# A commit that added outbox rows in another process says so here (core NATS, fire and
# forget), so relays wake at once wherever the row was written; their poll is only the fallback.
WAKE_SUBJECT = "mega.outbox.wake"
# How long publish_many waits for its PubAcks before it gives up (the relay's rows stay
# pending). On SQLite writers wait for the relay's transaction meanwhile, so this stays short.
PUBLISH_TIMEOUT_S = 2.0

RunEvent = Callable[[ReceivedEvent], Awaitable[None]]


class EventBus:
    """Emit the events of one bus alias and run its listener groups in this process.

    `EventBus(ctx, alias)` gives the driver's bus: `NatsEventBus` (below) for a `nats` bus,
    `RedisEventBus` (redis_bus.py) for `redis`, `MemoryEventBus` (memory_bus.py) for `memory`;
    an Event or a Listener does not change when its bus changes driver. `instance_id` names
    this process in DLQ records (default: the context's). Observers: `on(name, fn)` with a name
    of SIGNALS; unknown names raise ValueError.
    """

    # driver name -> bus class; each driver module adds itself (imported on first use).
    drivers: ClassVar[dict[str, type[EventBus]]] = {}

    def __new__(cls, ctx: Context, bus_alias: str, **options: Any) -> EventBus:
        if cls is EventBus:
            cls = _driver(ctx.bus(bus_alias).driver)
        return super().__new__(cls)

    def __init__(
        self,
        ctx: Context,
        bus_alias: str,
        *,
        instance_id: str | None = None,
        max_age_s: float = EVENTS_MAX_AGE_S,
        dlq_retry_delay_s: float = DLQ_RETRY_DELAY_S,
        apply_limits: bool = False,
    ) -> None:
        self.ctx = ctx
        self.apply_limits = apply_limits
        self.bus_alias = bus_alias
        self.instance_id = instance_id or ctx.instance_id
        self.max_age_s = max_age_s
        self.dlq_retry_delay_s = dlq_retry_delay_s
        self.signals = Signals(SIGNALS)
        self._specs: dict[type[Listener], ListenerSpec] = {}
        self._listening: set[type[Listener]] = set()
        self._stopped = False

    def on(self, name: str, observer: Observer) -> None:
        self.signals.on(name, observer)

    def spec(self, listener_cls: type[Listener]) -> ListenerSpec:
        spec = self._specs.get(listener_cls)
        if spec is None:
            spec = validate_listener(listener_cls, self.ctx.buses, self.ctx.caches)
            if spec.bus != self.bus_alias:
                raise JobError(
                    f"{spec.group} is on bus {spec.bus!r}, this event bus is {self.bus_alias!r}",
                    code="event.wrong_bus",
                )
            self._specs[listener_cls] = spec
        return spec

    async def emit(self, event_cls: type[Event], payload: Any, *, id: str | None = None) -> str:
        """Publish one event now and return its id once the bus has stored it.

        For code with no database write to pair it with; otherwise use the outbox, so that the
        event exists if and only if the transaction commits. `id` is the dedup key (default a
        random one). Raises JobError `event.invalid_payload` (nothing published) or
        DependencyUnavailable."""
        spec = validate_event(event_cls, self.ctx.buses)
        message = encode_event(spec, payload, event_id=id)
        await self.publish(message)
        return message.event_id

    async def listen(
        self, listener_cls: type[Listener], handler_ctx: Context | None = None
    ) -> None:
        """Run the group's consume loop in this process until `stop()` has drained it."""
        spec = await self.ensure(listener_cls)
        if self._stopped:
            return
        if listener_cls in self._listening:
            raise JobError(f"{spec.group} is already consumed here", code="event.twice")
        self._listening.add(listener_cls)
        try:
            await self._listen(spec, self._runner(spec, handler_ctx or self.ctx))
        finally:
            self._listening.discard(listener_cls)

    async def stop(self, timeout_s: float = 30.0) -> None:
        """Stop pulling, wait up to `timeout_s` for running listeners, hand the rest back."""
        self._stopped = True
        await self._stop(timeout_s)

    async def signal(self, name: str, **fields: Any) -> None:
        """Notify observers (skipped when nobody listens)."""
        if self.signals.has_observers(name):
            if "job" in fields:  # the consume loop names what it runs `job`: here, a group
                fields["group"] = fields.pop("job")
            await self.signals.emit(name, **fields)

    def _runner(self, spec: ListenerSpec, ctx: Context) -> RunEvent:
        """What runs one delivery of an event: the group's inbox check, `run`, the inbox mark."""
        listener = spec.listener_cls()
        inbox = (
            Inbox(ctx.cache(spec.inbox).native, spec.group, spec.inbox_ttl_s)
            if spec.inbox
            else None
        )

        async def run(event: ReceivedEvent) -> None:
            if inbox is not None and await inbox.seen(event.id):
                await self.signal("skip", group=spec.group, id=event.id, attempt=event.attempt)
                return
            await listener.run(event, ctx)
            if inbox is not None:
                await inbox.mark(event.id)

        return run

    # -- what each driver implements ----------------------------------------------------------

    @property
    def dlq(self) -> DeadLetterTools:
        """DLQ tools (list, count, requeue, purge) over the listener groups of this bus."""
        raise NotImplementedError

    @property
    def connected(self) -> bool:
        """Whether a publish can reach the bus now (the relay waits while it cannot)."""
        raise NotImplementedError

    async def ensure_stream(self) -> None:
        """Create where missing what holds this bus's events (never changes it once made)."""
        raise NotImplementedError

    async def ensure(self, listener_cls: type[Listener], *, force: bool = False) -> ListenerSpec:
        """The events stream and what the group consumes from, where missing."""
        raise NotImplementedError

    async def publish(self, message: EventMessage) -> bool:
        """Publish an encoded event; True when the bus kept it, False when it was a duplicate
        (an id it already has within the dedup window)."""
        raise NotImplementedError

    async def publish_many(self, messages: list[EventMessage]) -> None:
        """Publish encoded events in order and return once the bus has stored every one (the
        relay's path: duplicates are dropped silently)."""
        raise NotImplementedError

    async def stats(self, listener_cls: type[Listener]) -> JobStats:
        """The group's backlog right now: pending, in flight, dead letters."""
        raise NotImplementedError

    async def watch_commits(self, wake: Callable[[], None]) -> Callable[[], Awaitable[None]]:
        """Call `wake()` when another process announces an outbox commit (see announce_commit);
        returns what stops watching."""
        raise NotImplementedError

    def announce_commit(self) -> None:
        """Tell the relays of other processes that outbox rows were committed (fire and
        forget, from the event loop's thread)."""
        raise NotImplementedError

    async def _listen(self, spec: ListenerSpec, run: RunEvent) -> None:
        raise NotImplementedError

    async def _stop(self, timeout_s: float) -> None:
        raise NotImplementedError


def _driver(driver: str) -> type[EventBus]:
    if driver not in EventBus.drivers and driver in ("redis", "memory"):
        importlib.import_module(f"mega.events.{driver}_bus")  # it adds itself
    found = EventBus.drivers.get(driver)
    if found is None:
        raise JobError(f"no event bus for bus driver {driver!r}", code="event.driver")
    return found


class NatsEventBus(EventBus):
    """The events of one bus alias on NATS JetStream (see the module's docstring)."""

    def __init__(self, ctx: Context, bus_alias: str, **options: Any) -> None:
        super().__init__(ctx, bus_alias, **options)
        bus = ctx.bus(bus_alias)
        self.nc = bus.native
        # One JetStreamContext for the bus's life: its async-publish inbox is made once.
        self.js: JetStreamContext = bus.js
        self._stream_ready = False
        self._ensured: set[type[Listener]] = set()
        self._consumers: dict[type[Listener], _Consumer] = {}

    @property
    def dlq(self) -> DeadLetters:
        return DeadLetters(self.js, self.ensure)

    @property
    def connected(self) -> bool:
        return bool(self.nc.is_connected)

    # -- streams ------------------------------------------------------------------------------

    async def ensure_stream(self) -> None:
        """Create MEGA_EVENTS where missing (never changes an existing one)."""
        if self._stream_ready:
            return
        try:
            await ensure_stream(
                self.js,
                StreamConfig(
                    name=EVENTS_STREAM,
                    subjects=[SUBJECT_PREFIX + ">", REQUEUE_PREFIX + ">"],
                    retention=RetentionPolicy.LIMITS,
                    storage=StorageType.FILE,
                    max_age=self.max_age_s or None,
                    duplicate_window=DEDUP_WINDOW_S,
                    # A group's retries wait as schedules on `events_requeue.<group>._delay.*`.
                    allow_msg_schedules=True if schedules_supported(self.nc) else None,
                    num_replicas=self.ctx.bus(self.bus_alias).replicas,
                ),
            )
        except NATS_ERRORS as exc:
            raise DependencyUnavailable(
                "nats", f"cannot set up {EVENTS_STREAM} on bus {self.bus_alias!r}: {exc}"
            ) from exc
        self._stream_ready = True

    async def ensure(self, listener_cls: type[Listener], *, force: bool = False) -> ListenerSpec:
        """The events stream, the group's DLQ stream and its durable consumer, where missing.
        The consumer is brought in line with the class's pattern; its limits (ack wait,
        concurrency) only with `apply_limits` (see `ensure_consumer`)."""
        spec = self.spec(listener_cls)
        if listener_cls in self._ensured and not force:
            return spec
        if force:
            self._stream_ready = False
        await self.ensure_stream()
        try:
            await ensure_stream(
                self.js,
                dlq_stream_config(
                    spec.dlq_stream, spec.dlq_subject, spec.dlq_max_age_s, None, spec.replicas
                ),
            )
            await ensure_consumer(
                self.js,
                EVENTS_STREAM,
                ConsumerConfig(
                    durable_name=spec.durable,
                    ack_policy=AckPolicy.EXPLICIT,
                    deliver_policy=DeliverPolicy.ALL,
                    ack_wait=spec.ack_wait_s,
                    max_ack_pending=spec.concurrency,
                    max_deliver=-1,
                    filter_subjects=spec.filter_subjects,
                ),
                what=spec.group,
                apply_limits=self.apply_limits,
            )
        except NATS_ERRORS as exc:
            raise DependencyUnavailable(
                "nats", f"{spec.group}: cannot set up its consumer on {self.bus_alias!r}: {exc}"
            ) from exc
        self._ensured.add(listener_cls)
        return spec

    # -- emit ---------------------------------------------------------------------------------

    async def publish(self, message: EventMessage) -> bool:
        await self.ensure_stream()
        if not self.nc.is_connected:
            raise DependencyUnavailable(
                "nats", f"cannot emit: NATS bus {self.bus_alias!r} is not connected"
            )
        try:
            ack = await self.js.publish(message.subject, message.body, headers=message.headers)
        except NATS_ERRORS as exc:
            raise DependencyUnavailable("nats", f"cannot emit {message.subject}: {exc}") from exc
        event = message.subject.removeprefix(SUBJECT_PREFIX)
        await self.signal("emit", event=event, id=message.event_id, duplicate=ack.duplicate)
        return not ack.duplicate

    async def publish_many(self, messages: list[EventMessage]) -> None:
        await self.ensure_stream()
        futures: list[asyncio.Future[Any]] = []
        try:
            for message in messages:
                futures.append(
                    await self.js.publish_async(
                        message.subject, message.body, headers=message.headers
                    )
                )
            await asyncio.wait_for(asyncio.gather(*futures), PUBLISH_TIMEOUT_S)
        except (*NATS_ERRORS, TimeoutError):
            for future in futures:
                future.cancel()
            raise

    async def watch_commits(self, wake: Callable[[], None]) -> Callable[[], Awaitable[None]]:
        async def woken(msg: Msg) -> None:
            wake()

        try:
            subscription = await self.nc.subscribe(WAKE_SUBJECT, cb=woken)
        except NATS_ERRORS:  # not connected now: the relay polls meanwhile
            return not_watching

        async def unsubscribe() -> None:
            with contextlib.suppress(*NATS_ERRORS):
                await subscription.unsubscribe()

        return unsubscribe

    def announce_commit(self) -> None:
        async def publish() -> None:
            with contextlib.suppress(*NATS_ERRORS):
                await self.nc.publish(WAKE_SUBJECT, b"")

        fire_and_forget(publish())

    # -- listen -------------------------------------------------------------------------------

    async def _listen(self, spec: ListenerSpec, run_event: RunEvent) -> None:
        async def run(payload: Any, msg: Msg, attempt: int) -> None:
            headers = msg.headers or {}
            emitted = headers.get(HEADER_EMITTED_AT)
            await run_event(
                ReceivedEvent(
                    id=spec.message_id(headers) or "",
                    name=headers.get(HEADER_EVENT_NAME) or msg.subject.removeprefix(SUBJECT_PREFIX),
                    data=payload,
                    emitted_at=int(emitted) if emitted and emitted.isdigit() else None,
                    attempt=attempt,
                )
            )

        listener_cls = spec.listener_cls
        consumer = _Consumer(
            self, spec, run, functools.partial(self.ensure, listener_cls, force=True)
        )
        self._consumers[listener_cls] = consumer
        try:
            await consumer.run()
        finally:
            del self._consumers[listener_cls]

    async def stats(self, listener_cls: type[Listener]) -> JobStats:
        spec = await self.ensure(listener_cls)
        try:
            consumer = await self.js.consumer_info(EVENTS_STREAM, spec.durable)
            dlq = await self.js.stream_info(spec.dlq_stream)
        except NATS_ERRORS as exc:  # NotFoundError included
            raise DependencyUnavailable("nats", f"cannot read {spec.group}: {exc}") from exc
        return JobStats(
            pending=consumer.num_pending or 0,
            in_flight=consumer.num_ack_pending or 0,
            dlq=dlq.state.messages,
        )

    async def _stop(self, timeout_s: float) -> None:
        consumers = list(self._consumers.values())
        for consumer in consumers:
            consumer.request_stop(timeout_s)
        await asyncio.gather(*(consumer.closed.wait() for consumer in consumers))
        with contextlib.suppress(*NATS_ERRORS):
            await self.nc.flush(timeout=1)


EventBus.drivers["nats"] = NatsEventBus


_background: set[asyncio.Task[None]] = set()  # keeps fire-and-forget tasks alive


def fire_and_forget(coro: Coroutine[Any, Any, None]) -> None:
    task = asyncio.get_running_loop().create_task(coro)
    _background.add(task)
    task.add_done_callback(_background.discard)


async def not_watching() -> None:
    return None


async def emit(ctx: Context, event_cls: type[Event], payload: Any, *, id: str | None = None) -> str:
    """Publish one event now on its bus (after the PubAck); returns its id. For code with no
    database write to pair it with; otherwise `outbox.add` in the same transaction."""
    buses: dict[str, EventBus] = ctx.extras.setdefault("mega.event_buses", {})
    alias = getattr(event_cls, "bus", "")
    bus = buses.get(alias)
    if bus is None:
        bus = buses[alias] = EventBus(ctx, alias)
    return await bus.emit(event_cls, payload, id=id)
