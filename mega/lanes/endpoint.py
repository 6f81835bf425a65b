"""What jobs and listener groups share above the drivers: `LaneEndpoint`, the part of a
JobQueue and an EventBus that runs consume loops on a bus and reports their signals, and
`LaneRunner`, the host side (`JobRunner` and `ListenerRunner` are it with their own few names).

    worker = JobRunner(ctx)
    worker.register(EmailJob)           # validated here, against the context's buses
    worker.on("dlq", alert)
    await worker.start()                # queues ensured, one consume loop per class
    await worker.stop(timeout_s=30)     # stop fetching, finish what runs, hand back the rest

It keeps one endpoint (a JobQueue, an EventBus) per bus alias and re-sends every signal of its
endpoints, so one observer sees the whole host.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any, ClassVar, Generic, Protocol, TypeVar

from mega.context import Context
from mega.drivers.base import Bus, Delivery, DriverUnavailable, Lane, LaneStats
from mega.errors import DependencyUnavailable, JobError
from mega.lanes.consumer import Consumer
from mega.lanes.control import LaneControl
from mega.lanes.delivery import LanePolicy
from mega.lanes.executor import DLQ_RETRY_DELAY_S, Executor
from mega.lanes.flow import Limited, gate_of
from mega.lanes.presence import Presence, WorkerSeen, read_workers
from mega.lanes.recorded import Recorded
from mega.lanes.stages import Stage
from mega.lanes.status import StatusWriter
from mega.lanes.steps import StepEnds, StepReports
from mega.lanes.traced import Traced
from mega.signals import Observer, Signals


def lane_key_of(lane: Lane) -> str:
    """A lane's name for the keys of a shared store (its rate limit's log): its kind, name
    and subject, so that two lanes that share a name on different subjects stay apart."""
    return f"{lane.kind}:{lane.name}:{lane.subject}"


class Endpoint(Protocol):
    """What a lane worker needs of a JobQueue or an EventBus."""

    bus_alias: str

    def __init__(
        self, ctx: Context, bus_alias: str, *, instance_id: str | None, apply_limits: bool
    ) -> None: ...
    def on(self, name: str, observer: Observer) -> None: ...
    async def ensure(self, cls: Any) -> Any: ...
    async def consume(self, cls: Any) -> None: ...
    async def stop(self, timeout_s: float = ...) -> None: ...
    def tally(self) -> tuple[int, int]: ...


class Declared(Limited, Protocol):
    """What a lane worker needs of a JobSpec or a ListenerSpec: its bus, and its limits."""

    @property
    def bus(self) -> str: ...


E = TypeVar("E", bound=Endpoint)
S = TypeVar("S", bound=Declared)


class LaneEndpoint:
    """The lanes of one bus alias in this process: its driver (`bus`), its observers, and the
    consume loops it runs until `stop()`. `instance_id` names this process in DLQ records
    (default: the context's); `apply_limits` lets the classes' limits change running queues
    (the worker's `--apply-limits`). Observers: `on(name, fn)` with a name of
    `signal_names`; unknown names raise ValueError."""

    signal_names: ClassVar[tuple[str, ...]]
    kind: ClassVar[str]  # "job" or "event": the word in its error codes
    error: ClassVar[type[JobError]] = JobError  # what it raises (EventError for events)

    def __init__(
        self,
        ctx: Context,
        bus_alias: str,
        *,
        instance_id: str | None = None,
        dlq_retry_delay_s: float = DLQ_RETRY_DELAY_S,
        apply_limits: bool = False,
    ) -> None:
        self.ctx = ctx
        self.bus_alias = bus_alias
        self.bus: Bus = ctx.bus(bus_alias)
        self.instance_id = instance_id or ctx.instance_id
        self.dlq_retry_delay_s = dlq_retry_delay_s
        self.apply_limits = apply_limits
        self.signals = Signals(self.signal_names)
        self._consumers: dict[type[Any], Consumer] = {}
        self._declared: dict[type[Any], Any] = {}  # class -> its validated spec
        self._ensured: set[type[Any]] = set()  # the classes whose lane exists
        self._ensuring: dict[type[Any], asyncio.Lock] = {}  # one set-up at a time per class
        self._stopped = False

    def on(self, name: str, observer: Observer) -> None:
        """Observe a signal of this endpoint's consume loops and calls.

        Args:
            name: one of `signal_names`; any other raises ValueError.
            observer: called with each such signal, a dict `{"signal": name, **fields}`; a
                coroutine function is awaited.
        """
        self.signals.on(name, observer)

    def declared(self, cls: type[Any], validate: Callable[[type[Any]], S]) -> S:
        """`cls` validated (once, then cached), and checked to be on this endpoint's bus.

        Args:
            cls: the Job or Listener class.
            validate: checks the class and returns its spec (RegistrationError names a bad
                attribute); called on the first call for `cls` only. A spec whose `bus` is
                not this endpoint's raises `error` with code `<kind>.wrong_bus`.
        """
        spec: S | None = self._declared.get(cls)
        if spec is None:
            spec = validate(cls)
            if spec.bus != self.bus_alias:
                raise self.error(
                    f"{spec.name} is on bus {spec.bus!r}, not on this one, {self.bus_alias!r}",
                    code=f"{self.kind}.wrong_bus",
                )
            self._declared[cls] = spec
        return spec

    async def ensure_lane(
        self, cls: type[Any], lane: Lane, what: str, *, force: bool = False
    ) -> None:
        """Make `cls`'s lane exist on the bus; DependencyUnavailable(`what`) when the bus does
        not answer. Calls that come together (200 first enqueues at once) make it once: the
        others wait for that one, instead of each taking a connection of the bus's pool for
        the same set-up.

        Args:
            cls: the Job or Listener class whose lane it is; a class's lane is made once per
                process.
            lane: its lane, as the driver gets it.
            what: what failed, first in the DependencyUnavailable's message (such as "Email:
                cannot set up its queue"); the bus alias and the driver's error follow.
            force: ask the bus again even when the lane was made in this process (default
                False).
        """
        lock = self._ensuring.setdefault(cls, asyncio.Lock())
        async with lock:
            if cls in self._ensured and not force:
                return  # made while this call waited
            try:
                await self.bus.ensure(lane, apply_limits=self.apply_limits)
            except DriverUnavailable as exc:
                raise self.unavailable(what, exc) from exc
            self._ensured.add(cls)

    async def lane_stats(self, lane: Lane, what: str) -> LaneStats:
        """The lane now, as the engine counts it; DependencyUnavailable(`what`) otherwise.

        Args:
            lane: the job queue or listener group to count.
            what: what failed, first in the DependencyUnavailable's message (such as "cannot
                read Email's queue").
        """
        try:
            return await self.bus.stats(lane)
        except DriverUnavailable as exc:
            raise self.unavailable(what, exc) from exc

    async def lane_workers(self, lane: Lane, what: str) -> list[WorkerSeen]:
        """The consume loops seen on the lane (presence.py), the last seen first;
        DependencyUnavailable(`what`) when the bus does not answer.

        Args:
            lane: the job queue or listener group whose consume loops to read.
            what: what failed, first in the DependencyUnavailable's message (such as "cannot
                read Email's workers").
        """
        try:
            return await read_workers(self.bus, lane)
        except DriverUnavailable as exc:
            raise self.unavailable(what, exc) from exc

    async def signal(self, name: str, **fields: Any) -> None:
        """Notify observers, skipping the work when nobody listens (the hot path).

        Args:
            name: one of `signal_names`.
            **fields: what the signal says beside its name, as its observers get it.
        """
        if self.signals.has_observers(name):
            await self.signals.emit(name, **fields)

    async def run_lane(
        self,
        cls: type[Any],
        lane: Lane,
        policy: LanePolicy,
        run: Callable[[Any, Delivery], Awaitable[Any]],
        records: StatusWriter | None = None,
        control: LaneControl | None = None,
        steps: StepEnds | None = None,
    ) -> None:
        """Run the consume loop of `cls` (a Job, a Listener) on `lane` until `stop()`. Its
        stages (mega/lanes/stages.py), outermost first: its traces, then a job lane's `records`
        and `steps` (its status record around its workflows told of a step's end).

        Args:
            cls: the Job or Listener class; one loop per class at a time (a second raises
                `error` with code `<kind>.twice`).
            lane: its lane, made by `ensure_lane` first.
            policy: what the loop needs of the class's spec (a JobSpec, a ListenerSpec): its
                name, concurrency, ack wait, timeout, retries and limits.
            run: runs one delivery: called with its decoded payload and the Delivery, returns
                the run's result; what it raises is a failure, retried or dead-lettered as
                `policy` says.
            records: a job lane's status records (None: none written, as on a group lane).
            control: a job lane's pause and cancels (None: never paused or cancelled).
            steps: where a job lane reports the end of a workflow step (None: no workflows).
        """
        if self._stopped:
            return  # stop() came while the caller was setting up
        if cls in self._consumers:
            raise self.error(f"{policy.name} is already consumed here", code=f"{self.kind}.twice")
        group = lane.name if lane.kind == "group" else None
        stages: list[Stage] = [Traced(system=self.bus.driver, group=group)]
        if records is not None:
            stages.append(Recorded(records))
        if steps is not None:
            stages.append(StepReports(steps, name=policy.name, delay_s=self.dlq_retry_delay_s))
        executor = Executor(
            self.bus.receiver(lane, consumer=self.instance_id),
            policy,
            run,
            self.signal,
            instance_id=self.instance_id,
            group=group,
            dlq_retry_delay_s=self.dlq_retry_delay_s,
            records=records,
            control=control,
            stages=stages,
            middlewares=self.ctx.middlewares,
            observed=self.signals.has_observers,
        )
        consumer = Consumer(
            executor,
            presence=Presence(self.bus, lane, self.instance_id),
            gate=gate_of(self.ctx, policy, lane_key_of(lane)),
        )
        self._consumers[cls] = consumer
        try:
            await consumer.run()
        finally:
            del self._consumers[cls]

    def tally(self) -> tuple[int, int]:
        """Runs started and runs done by this endpoint's running consume loops."""
        executors = [consumer.executor for consumer in self._consumers.values()]
        return sum(e.runs_started for e in executors), sum(e.runs_done for e in executors)

    async def stop(self, timeout_s: float = 30.0) -> None:
        """Stop fetching, wait up to `timeout_s` for running work, then cancel the rest and
        hand it back to be delivered again. Final for consuming (publishing keeps working).

        Args:
            timeout_s: seconds to wait for running work before cancelling it (default 30).
        """
        self._stopped = True
        consumers = list(self._consumers.values())
        for consumer in consumers:
            consumer.request_stop(timeout_s)
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(*(consumer.closed.wait() for consumer in consumers))

    def unavailable(self, what: str, exc: DriverUnavailable) -> DependencyUnavailable:
        """The DependencyUnavailable to raise for a driver's error on this bus (returned, not
        raised), naming the driver and the bus alias.

        Args:
            what: what failed, first in its message (such as "cannot enqueue Email").
            exc: the driver's error, whose text ends the message.
        """
        return DependencyUnavailable(self.bus.driver, f"{what} on bus {self.bus_alias!r}: {exc}")


class LaneRunner(Generic[E, S]):
    """Run every registered class of one kind in this process (see the module).

    `instance_id` names the process in DLQ records (default: the context's); `apply_limits`
    lets the classes' limits change running queues (the worker's `--apply-limits`)."""

    # What subclasses say: their endpoint, signals, the word in their errors and task names,
    # their log.
    endpoint_cls: type[E]
    signal_names: ClassVar[tuple[str, ...]]
    kind: ClassVar[str]
    logger: ClassVar[logging.Logger]
    error: ClassVar[type[JobError]] = JobError
    # The signals its consume loops count themselves, read with `tally()` (a host's summary
    # line reads them instead of observing two signals a run).
    tallied: ClassVar[tuple[str, ...]] = ("start", "done")

    def __init__(
        self, ctx: Context, *, instance_id: str | None = None, apply_limits: bool = False
    ) -> None:
        self.ctx = ctx
        self.instance_id = instance_id or ctx.instance_id
        self.apply_limits = apply_limits
        self.signals = Signals(self.signal_names)
        self.endpoints: dict[str, E] = {}
        self.specs: list[S] = []
        self._classes: list[type[Any]] = []  # the registered classes, as `specs`
        self._tasks: list[asyncio.Task[None]] = []
        self._forwarded: set[tuple[str, str]] = set()

    # -- what each kind says ----------------------------------------------------------------------

    def validate(self, cls: type[Any]) -> S:
        raise NotImplementedError

    def key(self, spec: S) -> object:
        """What makes two registrations the same one."""
        raise NotImplementedError

    # -- the same for every kind --------------------------------------------------------------

    def on(self, name: str, observer: Observer) -> None:
        """Observe a signal of every endpoint; unknown names raise ValueError."""
        self.signals.on(name, observer)
        for endpoint in self.endpoints.values():
            self._forward(endpoint, name)

    def tally(self) -> dict[str, int]:
        """What its consume loops count themselves (`tallied`): runs started (`start`) and
        runs done (`done`), whether or not anything observes those signals."""
        started = done = 0
        for endpoint in self.endpoints.values():
            more_started, more_done = endpoint.tally()
            started, done = started + more_started, done + more_done
        return {"start": started, "done": done}

    def register(self, cls: type[Any]) -> S:
        """Validate a class (RegistrationError names the field) and add it; before start()."""
        if self._tasks:
            code = f"{self.kind}.worker_started"
            raise self.error("register() every class before start()", code=code)
        spec = self.validate(cls)
        if any(self.key(known) == self.key(spec) for known in self.specs):
            raise self.error(f"{spec.name} is registered twice", code=f"{self.kind}.twice")
        self.specs.append(spec)
        self._classes.append(cls)
        return spec

    def endpoint(self, alias: str) -> E:
        """The endpoint of a bus alias (made on first use), its signals forwarded here."""
        endpoint = self.endpoints.get(alias)
        if endpoint is None:
            endpoint = self.endpoints[alias] = self.endpoint_cls(
                self.ctx, alias, instance_id=self.instance_id, apply_limits=self.apply_limits
            )
            for name in self.signal_names:
                if self.signals.has_observers(name):
                    self._forward(endpoint, name)
        return endpoint

    async def start(self) -> None:
        """Ensure every class's queue, then run one consume loop per class. Returns once all
        loops run; raises DependencyUnavailable when a bus cannot be reached."""
        registered = list(zip(self._classes, self.specs, strict=True))
        for cls, spec in registered:
            gate_of(self.ctx, spec, "")  # its cache exists, or say so now
            await self.endpoint(spec.bus).ensure(cls)
        for cls, spec in registered:
            task = asyncio.create_task(
                self.endpoint(spec.bus).consume(cls), name=f"mega-{self.kind}-{spec.name}"
            )
            task.add_done_callback(self._loop_ended)
            self._tasks.append(task)

    async def stop(self, timeout_s: float = 30.0) -> None:
        """Stop fetching, wait up to `timeout_s` s for running work, then hand the rest back
        to be delivered again. Safe to call twice."""
        await asyncio.gather(*(e.stop(timeout_s) for e in self.endpoints.values()))
        if self._tasks:
            await asyncio.wait(self._tasks)
        self._tasks.clear()

    def _forward(self, endpoint: E, name: str) -> None:
        # Forward only signals someone observes: an endpoint skips building the signals nobody
        # hears, which matters at thousands of jobs per second.
        if (endpoint.bus_alias, name) in self._forwarded:
            return
        self._forwarded.add((endpoint.bus_alias, name))
        endpoint.on(name, self.signals.dispatch)

    def _loop_ended(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            self.logger.error("consume loop %s ended", task.get_name(), exc_info=task.exception())
