"""HashRates: how many rounds a second the hash ran at in the last runs on this machine.

A fixed figure ("about 3 million rounds a second") is wrong on a slower or busier machine, so
the page measures: this keeps the last LAST_RUNS successful runs of each mode, pool and inline
apart (the pool's child processes run at a lower priority than the web process, and may be
busy), and the rate is their rounds over their time: the time the route measured, the one the
page's result card shows. Memory of one web process, like the runs themselves.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import Any, Literal

Mode = Literal["pool", "inline"]
LAST_RUNS = 5  # runs of each mode the rate is measured over
# Shorter runs are mostly the request's own overhead, not hashing: they would understate the rate.
MIN_ROUNDS = 100_000
# The page's default run takes about this long here: long enough to watch the heartbeat, short
# enough that an inline run stalls the server for a moment, not half a minute.
PAGE_RUN_S = 2.0
# Before any run, the rate is estimated once from a run of this many rounds (a few ms to 0.5 s).
PROBE_ROUNDS = 100_000


class HashRates:
    def __init__(self, last_runs: int = LAST_RUNS, min_rounds: int = MIN_ROUNDS) -> None:
        self._runs: dict[Mode, deque[tuple[int, float]]] = {
            "pool": deque(maxlen=last_runs),
            "inline": deque(maxlen=last_runs),
        }
        self._min_rounds = min_rounds
        self._probe_rate: float | None = None  # rounds a second of the one probe, if made

    def record(self, mode: Mode, rounds: int, seconds: float) -> None:
        """A run that finished: `rounds` hashed in `seconds` (> 0) of wall time."""
        if rounds >= self._min_rounds and seconds > 0:
            self._runs[mode].append((rounds, seconds))

    def rate(self, mode: Mode) -> dict[str, int] | None:
        """`{rounds_per_s, runs}` over the last runs of `mode`, or None before the first one."""
        runs = self._runs[mode]
        if not runs:
            return None
        rounds = sum(r for r, _ in runs)
        seconds = sum(s for _, s in runs)
        return {"rounds_per_s": round(rounds / seconds), "runs": len(runs)}

    def page_rounds(
        self, hash_loop: Callable[[dict[str, Any]], Any], most: int, seconds: float = PAGE_RUN_S
    ) -> int:
        """The rounds that take about `seconds` here, to a 100,000 and within 100,000 to
        `most`: from the last inline runs' rate (what an inline run stalls the server for),
        else the pool's, else from one probe of `hash_loop` made once (kept apart: the page
        still says it has measured nothing)."""
        rate = self.rate("inline") or self.rate("pool")
        if rate is not None:
            per_s = float(rate["rounds_per_s"])
        else:
            if self._probe_rate is None:
                started = time.perf_counter()
                hash_loop({"input": "probe", "rounds": PROBE_ROUNDS})
                self._probe_rate = PROBE_ROUNDS / max(time.perf_counter() - started, 1e-6)
            per_s = self._probe_rate
        return int(min(most, max(MIN_ROUNDS, round(per_s * seconds, -5))))

    def text(self, rounds: int) -> str:
        """The page's sentence on this machine's speed, with what `rounds` would take; before
        any run, an invitation to measure, never a figure from elsewhere."""
        pool, inline = self.rate("pool"), self.rate("inline")
        if pool is None and inline is None:
            return (
                "How fast is this machine? Run it once to measure: this line then gives the "
                "rounds a second of the last runs, pool and inline apart."
            )
        parts = []
        for where, rate in (("in the pool", pool), ("inline", inline)):
            if rate is not None:
                runs = f"last {rate['runs']} run" + ("s" if rate["runs"] > 1 else "")
                figure = round(rate["rounds_per_s"], -4)  # the last digits are noise
                parts.append(f"{figure:,} rounds a second {where} ({runs})")
        first = pool or inline
        assert first is not None
        text = f"Measured on this machine: {', '.join(parts)}; so {rounds:,} rounds take about "
        text += f"{rounds / first['rounds_per_s']:.1f} s"
        if pool is None:
            return text + ". The pool's rate: run it there once to measure."
        if inline is None:
            return text + ". Inline: run it once on the event loop to compare."
        return text + " in the pool."
