"""How a host stops: SIGINT or SIGTERM, caught from its first step (`StopSignals`), drains
a running host and ends a starting one as a normal stop (`stopped_while_starting`)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal as os_signal
from collections.abc import Iterator

logger = logging.getLogger("mega.host")


class StopSignals:
    """SIGINT and SIGTERM, caught from a host's first step. One that comes while the host
    starts cancels the start (what it opened is closed, and it exits 0, as after a run); one
    that comes once it runs settles `running_until_signal()`. A second is not caught: it
    kills the process, as it would anyway, for an operator who will not wait for the drain."""

    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.host = asyncio.current_task()
        self.received: asyncio.Future[str] = self.loop.create_future()
        self.running = False

    def __enter__(self) -> StopSignals:
        for sig in (os_signal.SIGINT, os_signal.SIGTERM):
            self.loop.add_signal_handler(sig, self._on_signal, sig)
        return self

    def __exit__(self, *_: object) -> None:
        self._uninstall()

    @property
    def while_starting(self) -> bool:
        """Whether a signal came before the host was running."""
        return self.received.done() and not self.running

    def running_until_signal(self) -> asyncio.Future[str]:
        """The host is running: from now on a signal stops it through this future (its
        result: the signal's name) instead of cancelling it."""
        self.running = True
        return self.received

    def _on_signal(self, sig: os_signal.Signals) -> None:
        self._uninstall()
        self.received.set_result(sig.name)
        if not self.running and self.host is not None:
            self.host.cancel()

    def _uninstall(self) -> None:
        for sig in (os_signal.SIGINT, os_signal.SIGTERM):
            self.loop.remove_signal_handler(sig)


@contextlib.contextmanager
def stopped_while_starting(signals: StopSignals, role: str) -> Iterator[None]:
    """The cancel of a start by a signal (see StopSignals), ended as a normal stop."""
    try:
        yield
    except asyncio.CancelledError:
        if not signals.while_starting:
            raise
        logger.info("%s received while starting: %s stopped", signals.received.result(), role)
