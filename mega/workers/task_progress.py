"""progress(): how a pool task tells its caller how far it has got.

A task function calls `progress(0.25, "250,000 rounds")` as often as it likes; the pool carries
the latest figure back to the caller's `on_progress(fraction, note)` over the channel it already
has with the slot (a frame on the child's stdout in process mode, a loop callback in thread
mode). Anywhere else (a task called directly, a unit test, the web process) it is a no-op, so a
task module needs no "am I in a pool?" branch.

A tight loop may call it millions of times: `ProgressReporter` sends at most one message per
PROGRESS_INTERVAL_S and keeps the newest of the rest, which the slot sends before the result.
Standard library only (plus mega.validation): every pool child imports this module at startup.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from mega.validation import progress_fraction, progress_note

# At most one progress message per this many seconds per task: 20 a second is smooth enough for
# a progress bar and costs the parent's event loop nothing it would notice.
PROGRESS_INTERVAL_S = 0.05

# Receives (fraction, note) for the task running in this thread.
ProgressSink = Callable[[float, str | None], None]

_current = threading.local()  # .reporter: the ProgressReporter of the task this thread runs


class ProgressReporter:
    """Throttles one task's progress calls: the first goes out at once, then at most one per
    PROGRESS_INTERVAL_S; a call inside the interval is held (replacing any held before it) and
    `finish()` sends what is held, so the caller always sees the last figure before the result.
    """

    __slots__ = ("_held", "_next_at", "_send", "used")

    def __init__(self, send: ProgressSink) -> None:
        self._send = send
        self._next_at = 0.0
        self._held: tuple[float, str | None] | None = None
        self.used = False  # set by the first report; the slot checks it instead of a call

    def report(self, fraction: float, note: str | None) -> None:
        self.used = True
        now = time.monotonic()
        if now >= self._next_at:
            self._next_at = now + PROGRESS_INTERVAL_S
            self._held = None
            self._send(fraction, note)
        else:
            self._held = (fraction, note)

    def finish(self) -> None:
        """Send the held figure, if any, and reset for the next task."""
        held, self._held = self._held, None
        self._next_at = 0.0
        self.used = False
        if held is not None:
            self._send(*held)


def progress(fraction: float, note: str | None = None) -> None:
    """Report how far the running pool task has got.

    Inside a pool task the caller's `on_progress(fraction, note)` receives it, throttled to one
    message per PROGRESS_INTERVAL_S (the last one always arrives before the result). Outside a
    pool task it does nothing. Raises ValueError for a fraction that is not a number from 0 to 1
    or a note that is not a string.

    Args:
        fraction: how much of the task is done, from 0.0 to 1.0.
        note: a short text for the caller ("250,000 of 1,000,000 rounds"), cut at
            MAX_NOTE_CHARS; None sends none.
    """
    fraction, note = progress_fraction(fraction), progress_note(note)
    reporter: ProgressReporter | None = getattr(_current, "reporter", None)
    if reporter is not None:
        reporter.report(fraction, note)


def install(reporter: ProgressReporter | None) -> None:
    """Route progress() calls made in this thread to `reporter` (None: back to a no-op)."""
    _current.reporter = reporter
