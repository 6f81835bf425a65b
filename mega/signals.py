"""Named events with a closed set of names, for observers (logs, metrics, the demo pages).

Subscribing to a name the runtime does not emit raises ValueError at once: a typo in an
observer must not become a silent no-op. An observer that raises is logged and skipped; it
never breaks the runtime that emitted the event.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

logger = logging.getLogger("mega.events")

Observer = Callable[[dict[str, Any]], Awaitable[None] | None]


class EventEmitter:
    """`on(name, fn)` to observe, `emit(name, **fields)` to notify (awaits async observers)."""

    def __init__(self, names: Iterable[str]) -> None:
        self.event_names: frozenset[str] = frozenset(names)
        self._observers: dict[str, list[Observer]] = {name: [] for name in self.event_names}

    def on(self, name: str, observer: Observer) -> Callable[[], None]:
        """Subscribe; returns a function that unsubscribes."""
        self._check(name)
        self._observers[name].append(observer)
        return lambda: self.off(name, observer)

    def off(self, name: str, observer: Observer) -> None:
        self._check(name)
        if observer in self._observers[name]:
            self._observers[name].remove(observer)

    async def emit(self, name: str, **fields: Any) -> None:
        self._check(name)
        event = {"event": name, **fields}
        for observer in list(self._observers[name]):
            try:
                result = observer(event)
                if inspect.isawaitable(result):
                    await result
            except asyncio.CancelledError:
                raise
            except Exception:
                logger.exception("observer %r of event %r raised; ignored", observer, name)

    def has_observers(self, name: str) -> bool:
        return bool(self._observers[name])

    def _check(self, name: str) -> None:
        if name not in self.event_names:
            known = ", ".join(sorted(self.event_names))
            raise ValueError(f"unknown event {name!r}; this runtime emits: {known}")
