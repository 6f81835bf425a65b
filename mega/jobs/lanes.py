"""The host side of consuming: one consume loop per registered class, for jobs and listener
groups alike (`JobWorker` and `ListenerWorker` are this class with their own few names).

    worker = JobWorker(ctx)
    worker.register(EmailJob)           # validated here, against the context's buses
    worker.on("dlq", alert)
    await worker.start()                # queues ensured, one consume loop per class
    await worker.stop(timeout_s=30)     # stop fetching, finish what runs, hand back the rest

It keeps one endpoint (a JobQueue, an EventBus) per bus alias and re-sends every signal of its
endpoints, so one observer sees the whole host.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any, ClassVar, Generic, Protocol, TypeVar

from mega.context import Context
from mega.errors import JobError
from mega.signals import Observer, Signals


class Endpoint(Protocol):
    """What a lane worker needs of a JobQueue or an EventBus."""

    bus_alias: str

    def on(self, name: str, observer: Observer) -> None: ...
    async def stop(self, timeout_s: float = ...) -> None: ...


class Declared(Protocol):
    """What a lane worker needs of a JobSpec or a ListenerSpec."""

    @property
    def name(self) -> str: ...
    @property
    def bus(self) -> str: ...


E = TypeVar("E", bound=Endpoint)
S = TypeVar("S", bound=Declared)


class LaneWorker(Generic[E, S]):
    """Run every registered class of one kind in this process (see the module).

    `instance_id` names the process in DLQ records (default: the context's); `apply_limits`
    lets the classes' limits change running queues (the worker's `--apply-limits`)."""

    # What subclasses say: their signals, the word in their errors and task names, their log.
    signal_names: ClassVar[tuple[str, ...]]
    kind: ClassVar[str]
    logger: ClassVar[logging.Logger]

    def __init__(
        self, ctx: Context, *, instance_id: str | None = None, apply_limits: bool = False
    ) -> None:
        self.ctx = ctx
        self.instance_id = instance_id or ctx.instance_id
        self.apply_limits = apply_limits
        self.signals = Signals(self.signal_names)
        self.endpoints: dict[str, E] = {}
        self.specs: list[S] = []
        self._tasks: list[asyncio.Task[None]] = []
        self._forwarded: set[tuple[str, str]] = set()

    # -- what each kind says ----------------------------------------------------------------------

    def validate(self, cls: type[Any]) -> S:
        raise NotImplementedError

    def key(self, spec: S) -> object:
        """What makes two registrations the same one."""
        raise NotImplementedError

    def make_endpoint(self, alias: str) -> E:
        raise NotImplementedError

    async def ensure(self, endpoint: E, spec: S) -> None:
        raise NotImplementedError

    def consume(self, endpoint: E, spec: S) -> Coroutine[Any, Any, None]:
        raise NotImplementedError

    # -- the same for every kind --------------------------------------------------------------

    def on(self, name: str, observer: Observer) -> None:
        """Observe a signal of every endpoint; unknown names raise ValueError."""
        self.signals.on(name, observer)
        for endpoint in self.endpoints.values():
            self._forward(endpoint, name)

    def register(self, cls: type[Any]) -> S:
        """Validate a class (RegistrationError names the field) and add it; before start()."""
        if self._tasks:
            code = f"{self.kind}.worker_started"
            raise JobError("register() every class before start()", code=code)
        spec = self.validate(cls)
        if any(self.key(known) == self.key(spec) for known in self.specs):
            raise JobError(f"{spec.name} is registered twice", code=f"{self.kind}.twice")
        self.specs.append(spec)
        return spec

    def endpoint(self, alias: str) -> E:
        """The endpoint of a bus alias (made on first use), its signals forwarded here."""
        endpoint = self.endpoints.get(alias)
        if endpoint is None:
            endpoint = self.endpoints[alias] = self.make_endpoint(alias)
            for name in self.signal_names:
                if self.signals.has_observers(name):
                    self._forward(endpoint, name)
        return endpoint

    async def start(self) -> None:
        """Ensure every class's queue, then run one consume loop per class. Returns once all
        loops run; raises DependencyUnavailable when a bus cannot be reached."""
        for spec in self.specs:
            await self.ensure(self.endpoint(spec.bus), spec)
        for spec in self.specs:
            task = asyncio.create_task(
                self.consume(self.endpoint(spec.bus), spec), name=f"mega-{self.kind}-{spec.name}"
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

        async def forward(signal: dict[str, Any]) -> None:
            await self.signals.emit(name, **{k: v for k, v in signal.items() if k != "signal"})

        endpoint.on(name, forward)

    def _loop_ended(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            self.logger.error("consume loop %s ended", task.get_name(), exc_info=task.exception())
