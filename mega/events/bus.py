"""EventBus: the events stream of one bus alias, `emit`, and the listener groups' consume loops.

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
from typing import Any

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
from mega.jobs.consumer import NATS_ERRORS, _Consumer
from mega.jobs.dlq import DeadLetters
from mega.jobs.queue import DEDUP_WINDOW_S, JobStats, dlq_stream_config, ensure_stream
from mega.signals import Observer, Signals

SIGNALS = ("emit", "start", "done", "retry", "fail", "dlq", "skip")
# An exhausted event whose DLQ record cannot be written comes back after this long.
DLQ_RETRY_DELAY_S = 5.0


class EventBus:
    """Emit the events of one bus alias and run its listener groups in this process.

    `instance_id` names this process in DLQ records (default: the context's). Observers:
    `on(name, fn)` with a name of SIGNALS; unknown names raise ValueError.
    """

    def __init__(
        self,
        ctx: Context,
        bus_alias: str,
        *,
        instance_id: str | None = None,
        max_age_s: float = EVENTS_MAX_AGE_S,
        dlq_retry_delay_s: float = DLQ_RETRY_DELAY_S,
    ) -> None:
        self.ctx = ctx
        self.bus_alias = bus_alias
        self.instance_id = instance_id or ctx.instance_id
        self.max_age_s = max_age_s
        self.dlq_retry_delay_s = dlq_retry_delay_s
        self.signals = Signals(SIGNALS)
        bus = ctx.bus(bus_alias)
        if bus.driver != "nats":
            raise JobError(
                f"bus {bus_alias!r} ({bus.driver}): events and listeners run on a nats bus; "
                "the memory driver carries jobs only for now",
                code="event.driver",
            )
        self.nc = bus.native
        self.js: JetStreamContext = bus.js
        self._stream_ready = False
        self._specs: dict[type[Listener], ListenerSpec] = {}
        self._ensured: set[type[Listener]] = set()
        self._consumers: dict[type[Listener], _Consumer] = {}
        self._stopped = False

    def on(self, name: str, observer: Observer) -> None:
        self.signals.on(name, observer)

    @property
    def dlq(self) -> DeadLetters:
        """DLQ tools (list, count, requeue, purge) over the listener groups of this bus."""
        return DeadLetters(self.js, self.ensure)

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
                ),
            )
        except NATS_ERRORS as exc:
            raise DependencyUnavailable(
                "nats", f"cannot set up {EVENTS_STREAM} on bus {self.bus_alias!r}: {exc}"
            ) from exc
        self._stream_ready = True

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

    async def ensure(self, listener_cls: type[Listener], *, force: bool = False) -> ListenerSpec:
        """The events stream, the group's DLQ stream and its durable consumer, where missing.
        The consumer is brought in line with the class (filter, ack wait, concurrency)."""
        spec = self.spec(listener_cls)
        if listener_cls in self._ensured and not force:
            return spec
        if force:
            self._stream_ready = False
        await self.ensure_stream()
        try:
            await ensure_stream(
                self.js,
                dlq_stream_config(spec.dlq_stream, spec.dlq_subject, spec.dlq_max_age_s, None),
            )
            await self.js.add_consumer(
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
            )
        except NATS_ERRORS as exc:
            raise DependencyUnavailable(
                "nats", f"{spec.group}: cannot set up its consumer on {self.bus_alias!r}: {exc}"
            ) from exc
        self._ensured.add(listener_cls)
        return spec

    # -- emit ---------------------------------------------------------------------------------

    async def emit(self, event_cls: type[Event], payload: Any, *, id: str | None = None) -> str:
        """Publish one event now and return its id once JetStream has stored it.

        For code with no database write to pair it with; otherwise use the outbox, so that the
        event exists if and only if the transaction commits. `id` is the dedup key (default a
        random one). Raises JobError `event.invalid_payload` (nothing published) or
        DependencyUnavailable."""
        spec = validate_event(event_cls, self.ctx.buses)
        message = encode_event(spec, payload, event_id=id)
        await self.publish(message)
        return message.event_id

    async def publish(self, message: EventMessage) -> bool:
        """Publish an encoded event (the relay's path); True when JetStream kept it, False when
        it was a duplicate of one it already has."""
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

    # -- listen -------------------------------------------------------------------------------

    async def listen(
        self, listener_cls: type[Listener], handler_ctx: Context | None = None
    ) -> None:
        """Run the group's consume loop in this process until `stop()` has drained it."""
        spec = await self.ensure(listener_cls)
        if self._stopped:
            return
        if listener_cls in self._consumers:
            raise JobError(f"{spec.group} is already consumed here", code="event.twice")
        ctx = handler_ctx or self.ctx
        listener = spec.listener_cls()
        inbox = (
            Inbox(ctx.cache(spec.inbox).native, spec.group, spec.inbox_ttl_s)
            if spec.inbox
            else None
        )

        async def run(payload: Any, msg: Msg, attempt: int) -> None:
            headers = msg.headers or {}
            emitted = headers.get(HEADER_EMITTED_AT)
            event = ReceivedEvent(
                id=spec.message_id(headers) or "",
                name=headers.get(HEADER_EVENT_NAME) or msg.subject.removeprefix(SUBJECT_PREFIX),
                data=payload,
                emitted_at=int(emitted) if emitted and emitted.isdigit() else None,
                attempt=attempt,
            )
            if inbox is not None and await inbox.seen(event.id):
                await self.signal("skip", group=spec.group, id=event.id, attempt=attempt)
                return
            await listener.run(event, ctx)
            if inbox is not None:
                await inbox.mark(event.id)

        consumer = _Consumer(
            self, spec, run, functools.partial(self.ensure, listener_cls, force=True)
        )
        self._consumers[listener_cls] = consumer
        try:
            await consumer.run()
        finally:
            del self._consumers[listener_cls]

    async def stats(self, listener_cls: type[Listener]) -> JobStats:
        """The group's backlog right now: pending, in flight, dead letters."""
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

    async def stop(self, timeout_s: float = 30.0) -> None:
        """Stop pulling, wait up to `timeout_s` for running listeners, hand the rest back."""
        self._stopped = True
        consumers = list(self._consumers.values())
        for consumer in consumers:
            consumer.request_stop(timeout_s)
        await asyncio.gather(*(consumer.closed.wait() for consumer in consumers))
        with contextlib.suppress(*NATS_ERRORS):
            await self.nc.flush(timeout=1)

    async def signal(self, name: str, **fields: Any) -> None:
        """Notify observers (skipped when nobody listens)."""
        if self.signals.has_observers(name):
            if "job" in fields:  # the consume loop names what it runs `job`: here, a group
                fields["group"] = fields.pop("job")
            await self.signals.emit(name, **fields)


async def emit(ctx: Context, event_cls: type[Event], payload: Any, *, id: str | None = None) -> str:
    """Publish one event now on its bus (after the PubAck); returns its id. For code with no
    database write to pair it with; otherwise `outbox.add` in the same transaction."""
    buses: dict[str, EventBus] = ctx.extras.setdefault("mega.event_buses", {})
    alias = getattr(event_cls, "bus", "")
    bus = buses.get(alias)
    if bus is None:
        bus = buses[alias] = EventBus(ctx, alias)
    return await bus.emit(event_cls, payload, id=id)
