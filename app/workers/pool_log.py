"""PoolLog: the last few times the hash pool replaced a child, as lines for /demo/worker.

A replacement takes about a third of a second here, and the page polls the pool once a second:
the dip in `processes` goes by unseen. So the web app observes the pool's `replaced` signal
(`create_app` in app/web.py) and keeps the newest MAX_LINES here, in this web process's memory,
for the page's pool log ("child 13236 killed, replaced by 13301 in 0.3 s").
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

MAX_LINES = 10  # the page shows them all, newest first
# The pool's `reason` of a replacement, as the log says it.
VERBS = {
    "killed": "killed",  # kill_one(): the page's "Kill one pool child"
    "timeout": "killed past its timeout",
    "crashed": "crashed",
}


class PoolLog:
    """Lines `{at, text, pid, new_pid, reason, ms}`, `at` as HH:MM:SS in UTC."""

    def __init__(
        self, max_lines: int = MAX_LINES, clock: Callable[[], datetime] = lambda: datetime.now(UTC)
    ) -> None:
        self._lines: deque[dict[str, Any]] = deque(maxlen=max_lines)
        self._clock = clock

    def record(self, signal: dict[str, Any]) -> None:
        """A `replaced` signal of the pool (WorkerPool.on("replaced", log.record))."""
        verb = VERBS.get(signal["reason"], signal["reason"])
        seconds = signal["ms"] / 1000
        self._lines.append(
            {
                "at": self._clock().astimezone(UTC).strftime("%H:%M:%S"),
                "text": f"child {signal['pid']} {verb}, replaced by {signal['new_pid']} "
                f"in {seconds:.1f} s",
                "pid": signal["pid"],
                "new_pid": signal["new_pid"],
                "reason": signal["reason"],
                "ms": signal["ms"],
            }
        )

    def lines(self) -> list[dict[str, Any]]:
        """Newest first."""
        return list(reversed(self._lines))
