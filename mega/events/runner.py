"""ListenerRunner: the listener groups of a host, one consume loop per registered Listener.

    listeners = ListenerRunner(ctx)
    listeners.register(WelcomeEmailListener)    # validated here
    listeners.on("dlq", alert)
    await listeners.start()                     # groups ensured, loops running
    await listeners.stop(timeout_s=30)          # drain, then hand the rest back

The host side is the jobs' own `LaneRunner` (mega/lanes/endpoint.py), with one EventBus per alias.
"""

from __future__ import annotations

import logging
from typing import Any, ClassVar

from mega.errors import EventError, JobError
from mega.events.bus import SIGNALS, EventBus
from mega.events.listener import ListenerSpec, validate_listener
from mega.lanes.endpoint import LaneRunner


class ListenerRunner(LaneRunner[EventBus, ListenerSpec]):
    """Run every registered Listener group in this process (see LaneRunner)."""

    endpoint_cls = EventBus
    signal_names: ClassVar[tuple[str, ...]] = SIGNALS
    kind: ClassVar[str] = "event"
    error: ClassVar[type[JobError]] = EventError
    logger: ClassVar[logging.Logger] = logging.getLogger("mega.listeners")

    def validate(self, cls: type[Any]) -> ListenerSpec:
        return validate_listener(
            cls, self.ctx.buses, self.ctx.caches, database=self.ctx.has_database
        )

    def key(self, spec: ListenerSpec) -> object:
        """What makes two registrations the same one: the listener's group.

        Args:
            spec: a registered listener's validated spec.
        """
        return spec.group

    def bus(self, alias: str) -> EventBus:
        """The event bus of an alias (made on first use), its signals forwarded here.

        Args:
            alias: a bus alias of the config (ConfigError naming it otherwise).
        """
        return self.endpoint(alias)
