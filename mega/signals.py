"""Signals: named notifications a runtime sends its observers (logs, metrics, live pages).

Not to be confused with domain events (`Event`, facts such as "user.signed_up" that travel on
the bus to listeners): a signal is the runtime telling this process what it just did ("a job
started", "a tick was skipped"), and it never leaves the process.

Each runtime sends a closed set of signal names. Subscribing to a name the runtime does not
send raises ValueError at once: a typo in an observer must not become a silent no-op. An
observer receives one dict, `{"signal": name, **fields}`; an observer that raises is logged and
skipped, and never breaks the runtime that sent the signal.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

logger = logging.getLogger("mega.signals")

Observer = Callable[[dict[str, Any]], Awaitable[None] | None]


class Signals:
    """`on(name, fn)` to observe, `emit(name, **fields)` to notify (awaits async observers)."""

    def __init__(self, names: Iterable[str]) -> None:
        """A runtime's signals, with no observers yet.

        Args:
            names: every signal name the runtime sends; `on`, `off` and `emit` refuse any
                other with ValueError.
        """
        self.names: frozenset[str] = frozenset(names)
        # A tuple per name, replaced (not changed) by on and off: a dispatch under way keeps
        # the observers it started with, and none copies them (thousands of jobs a second).
        self._observers: dict[str, tuple[Observer, ...]] = {name: () for name in self.names}

    def on(self, name: str, observer: Observer) -> Callable[[], None]:
        """Subscribe; returns a function that unsubscribes.

        Args:
            name: one of the runtime's signal names.
            observer: called with each such signal, a dict `{"signal": name, **fields}`; a
                coroutine function is awaited.
        """
        self._check(name)
        self._observers[name] += (observer,)
        return lambda: self.off(name, observer)

    def off(self, name: str, observer: Observer) -> None:
        """Unsubscribe; nothing happens when the observer was not subscribed.

        Args:
            name: one of the runtime's signal names.
            observer: what `on` was given.
        """
        self._check(name)
        observers = list(self._observers[name])
        if observer in observers:
            observers.remove(observer)
            self._observers[name] = tuple(observers)

    async def emit(self, name: str, **fields: Any) -> None:
        """Notify the observers of a signal, one after the other, awaiting the async ones.

        Args:
            name: one of the runtime's signal names.
            **fields: what the signal says, beside its name.
        """
        self._check(name)
        await self.dispatch({"signal": name, **fields})

    async def dispatch(self, signal: dict[str, Any]) -> None:
        """Notify the observers of a signal another runtime built, as it is: how a host relays
        its parts' signals without building them again.

        Args:
            signal: the signal, `{"signal": name, **fields}`, its name one of this runtime's.
        """
        name = signal["signal"]
        for observer in self._observers[name]:
            try:
                result = observer(signal)
                if result is not None and inspect.isawaitable(result):
                    await result
            except asyncio.CancelledError:
                raise
            except Exception:
                logger.exception("observer %r of signal %r raised; ignored", observer, name)

    def has_observers(self, name: str) -> bool:
        """Whether anyone observes a signal: when not, a runtime may skip building it.

        Args:
            name: one of the runtime's signal names.
        """
        return bool(self._observers[name])

    def _check(self, name: str) -> None:
        if name not in self.names:
            known = ", ".join(sorted(self.names))
            raise ValueError(f"unknown signal {name!r}; this runtime sends: {known}")
