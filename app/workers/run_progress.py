"""RunProgress: the latest progress of each pool run of this web process, by the page's run id.

The page names its run (a random id), sends it with POST /api/demo/worker/hash, and polls GET
/api/demo/worker/progress?run_id=... while the hash runs; the route's `on_progress` callback
writes here. Memory of one web process: with several, a poll that reaches another one sees
nothing and the bar just waits. Bounded: at most MAX_RUNS entries (the oldest go first), each
removed when its run ends or RUN_TTL_S after it started, whichever comes first.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

MAX_RUNS = 256  # runs tracked at once; the pool holds far fewer (pool_size + max_queue)
RUN_TTL_S = 60.0  # a run still listed this long after it started is forgotten


@dataclass
class _Entry:
    started_at: float
    fraction: float = 0.0
    note: str | None = None


class RunProgress:
    """run id -> {fraction, note} of a run in flight. Every call is O(1) (amortised)."""

    def __init__(
        self,
        max_runs: int = MAX_RUNS,
        ttl_s: float = RUN_TTL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._runs: OrderedDict[str, _Entry] = OrderedDict()  # oldest start first
        self._max_runs, self._ttl_s, self._clock = max_runs, ttl_s, clock

    def __len__(self) -> int:
        return len(self._runs)

    def start(self, run_id: str) -> None:
        """A run begins at 0; a run id already listed starts over."""
        self._runs.pop(run_id, None)
        self._runs[run_id] = _Entry(self._clock())
        self._expire()
        while len(self._runs) > self._max_runs:
            self._runs.popitem(last=False)

    def update(self, run_id: str, fraction: float, note: str | None) -> None:
        """The run's latest figure; ignored for a run no longer listed."""
        entry = self._runs.get(run_id)
        if entry is not None:
            entry.fraction, entry.note = fraction, note

    def get(self, run_id: str) -> dict[str, float | str | None] | None:
        """`{fraction, note}` of a listed run, else None (unknown, ended or expired)."""
        self._expire()
        entry = self._runs.get(run_id)
        return None if entry is None else {"fraction": entry.fraction, "note": entry.note}

    def end(self, run_id: str) -> None:
        self._runs.pop(run_id, None)

    def _expire(self) -> None:
        oldest_allowed = self._clock() - self._ttl_s
        while self._runs:
            run_id, entry = next(iter(self._runs.items()))
            if entry.started_at > oldest_allowed:
                return
            del self._runs[run_id]
