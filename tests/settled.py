"""Waiting for what must not happen, as an event instead of a time.

A test that asserts "no duplicate", "no second run", "nothing started" has nothing to wait for:
what it checks is an absence. Sleeping "long enough for it to happen, were it to" waits a time
that a loaded machine can outlast. An engine, though, delivers again only a message it still
holds unsettled: once a lane has no message waiting and none delivered and unsettled, nothing
of what was enqueued can run again, whatever the time. `settled` waits for that state of the
lane, read from its engine (`LaneStats`), with a deadline.

A paused lane reaches a state of its own: every slot holds a fetched delivery that waits for
the resume (mega/lanes/consumer.py, `held`), so nothing more is fetched and nothing starts.
`settled(..., pending=n, in_flight=slots)` waits for that one.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from mega.drivers.values import LaneStats

POLL_S = 0.05


async def settled(
    read: Callable[[], Awaitable[LaneStats]],
    what: str,
    *,
    pending: int = 0,
    in_flight: int = 0,
    timeout_s: float = 30.0,
) -> LaneStats:
    """Until `read()` (a lane's stats: `queue.stats(job)`, `bus.stats(listener)`) counts
    `pending` messages waiting and `in_flight` delivered and unsettled (by default none of
    either); the stats then. Fails naming `what` and the last read at the deadline."""
    deadline = time.monotonic() + timeout_s
    while True:
        stats = await read()
        if (stats.pending, stats.in_flight) == (pending, in_flight):
            return stats
        assert time.monotonic() < deadline, (
            f"{what}: never {pending} pending and {in_flight} in flight; last {stats}"
        )
        await asyncio.sleep(POLL_S)
