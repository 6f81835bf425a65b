"""What every peer script shares: timing a worker until every job has run, and the report.

The scripts run in the peers' own virtualenv, from this folder (`python bench/peers/x.py`), so
they import this module by its file name."""

from __future__ import annotations

import asyncio
import time
from collections import Counter

# A safety net: after this long without progress, report what ran ("ran" < the jobs).
STALL_S = 10.0


async def until_all_ran(ran: Counter[int], jobs: int, worker: asyncio.Task[object]) -> float:
    """Seconds from now until `jobs` distinct jobs ran (or the worker ended, or stalled)."""
    started = time.perf_counter()
    progress_at, seen = started, 0
    while len(ran) < jobs and not worker.done():
        await asyncio.sleep(0.001)
        if len(ran) != seen:
            progress_at, seen = time.perf_counter(), len(ran)
        elif time.perf_counter() - progress_at > STALL_S:
            break
    return time.perf_counter() - started


def report(ran: Counter[int], jobs: int, elapsed: float, left: int, unit: str) -> dict[str, object]:
    """The JSON line's fields: `<unit>_per_s`, how many ran, whether each of 0..jobs-1 ran once
    and nothing is left in the peer's queue (`left`, 0: nothing would run again)."""
    exactly_once = set(ran.values()) == {1} and sorted(ran) == list(range(jobs)) and left == 0
    return {
        f"{unit}_per_s": jobs / elapsed,
        "ran": len(ran),
        "exactly_once": exactly_once,
        "left": left,
    }
