"""ListenerWorker: the listener groups of a host, one consume loop per registered Listener.

    listeners = ListenerWorker(ctx)
    listeners.register(WelcomeEmailListener)    # validated here
    listeners.on("dlq", alert)
    await listeners.start()                     # streams and consumers ensured, loops running
    await listeners.stop(timeout_s=30)          # drain, then hand the rest back

One EventBus per bus alias; every signal of the buses is re-sent to this worker's observers.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from mega.context import Context
from mega.errors import JobError
from mega.events.bus import SIGNALS, EventBus
from mega.events.listener import Listener, ListenerSpec, validate_listener
from mega.signals import Observer, Signals

logger = logging.getLogger("mega.listeners")


class ListenerWorker:
    """Run every registered Listener group in this process."""

    def __init__(
        self, ctx: Context, *, instance_id: str | None = None, apply_limits: bool = False
    ) -> None:
        self.ctx = ctx
        self.instance_id = instance_id or ctx.instance_id
        self.apply_limits = apply_limits
        self.signals = Signals(SIGNALS)
        self.buses: dict[str, EventBus] = {}
        self.specs: list[ListenerSpec] = []
        self._tasks: list[asyncio.Task[None]] = []
        self._forwarded: set[tuple[str, str]] = set()

    def on(self, name: str, observer: Observer) -> None:
        """Observe a signal of every group (ValueError for an unknown name)."""
        self.signals.on(name, observer)
        for bus in self.buses.values():
            self._forward(bus, name)

    def register(self, listener_cls: type[Listener]) -> ListenerSpec:
        """Validate a Listener class (RegistrationError names the field) and add it."""
        if self._tasks:
            raise JobError("register() listeners before start()", code="event.worker_started")
        spec = validate_listener(listener_cls, self.ctx.buses, self.ctx.caches)
        if any(known.group == spec.group for known in self.specs):
            raise JobError(f"listener group {spec.group!r} is registered twice", code="event.twice")
        self.specs.append(spec)
        return spec

    def bus(self, alias: str) -> EventBus:
        """The event bus of an alias (made on first use), its signals forwarded here."""
        bus = self.buses.get(alias)
        if bus is None:
            bus = self.buses[alias] = EventBus(
                self.ctx, alias, instance_id=self.instance_id, apply_limits=self.apply_limits
            )
            for name in SIGNALS:
                if self.signals.has_observers(name):
                    self._forward(bus, name)
        return bus

    async def start(self) -> None:
        """Ensure every group's stream and consumer, then run one consume loop per group."""
        for spec in self.specs:
            await self.bus(spec.bus).ensure(spec.listener_cls)
        for spec in self.specs:
            task = asyncio.create_task(
                self.bus(spec.bus).listen(spec.listener_cls), name=f"mega-group-{spec.group}"
            )
            task.add_done_callback(self._loop_ended)
            self._tasks.append(task)

    async def stop(self, timeout_s: float = 30.0) -> None:
        """Stop pulling, wait up to `timeout_s` for running listeners, hand the rest back."""
        await asyncio.gather(*(bus.stop(timeout_s) for bus in self.buses.values()))
        if self._tasks:
            await asyncio.wait(self._tasks)
        self._tasks.clear()

    def _forward(self, bus: EventBus, name: str) -> None:
        # Only signals someone observes: a bus skips building the ones nobody hears, which
        # matters at thousands of events a second.
        if (bus.bus_alias, name) in self._forwarded:
            return
        self._forwarded.add((bus.bus_alias, name))

        async def forward(signal: dict[str, Any]) -> None:
            await self.signals.emit(name, **{k: v for k, v in signal.items() if k != "signal"})

        bus.on(name, forward)

    def _loop_ended(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            logger.error("listener loop %s ended", task.get_name(), exc_info=task.exception())
