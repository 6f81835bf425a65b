"""Event fan-out against the number of listener groups: 1, 10 and 50 groups hearing one
event, in one `ListenerRunner` process, on the nats, redis and postgres drivers. Each group
receives every event once; the figure is each group's rate (events it ran per second, from
the first emit to its last run). Target: each group's rate with 50 groups at least 0.5x its
rate with 1 (more groups share the same two cores, so a group's rate falls; it must not fall
off a cliff).

EVENTS events are emitted once the groups exist (they hear only events after their start),
each listener run a no-op that counts it; every group must count every event exactly once.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter

from bench.bench_drivers import driver_context
from bench.report import Result
from bench.scale import curve, last_against_first
from mega import Context, Event, EventBus, Listener, ListenerRunner, ReceivedEvent

GROUPS = (1, 10, 50)
DRIVERS = ("nats", "redis", "postgres")
EVENTS = 2_000
RATE_TARGET = 0.5
TIMEOUT_S = 300.0
SEEN: dict[str, Counter[str]] = {}  # group -> event id -> runs
LAST: dict[str, float] = {}  # group -> when it ran its last event (perf_counter)


class Ping(Event):
    name = "bench.scale.ping"
    bus = "jobs"


class Hear(Listener):
    event = Ping
    concurrency = 100

    async def run(self, event: ReceivedEvent, ctx: Context) -> None:
        SEEN[self.group][event.id] += 1
        LAST[self.group] = time.perf_counter()


async def _rate(driver: str, url: str, groups: int) -> float:
    """The slowest group's events per second with `groups` groups."""
    ctx = await driver_context(driver, url)
    run = f"{driver}{groups}x{time.monotonic_ns() % 10**8}"
    names = [f"g{run}n{n}" for n in range(groups)]
    SEEN.update({name: Counter() for name in names})
    worker = ListenerRunner(ctx)
    for name in names:
        worker.register(type(f"Hear{name}", (Hear,), {"group": name}))
    try:
        await worker.start()
        bus = EventBus(ctx, "jobs")
        started = time.perf_counter()
        await asyncio.gather(*(bus.emit(Ping, {"n": n}) for n in range(EVENTS)))
        deadline = time.monotonic() + TIMEOUT_S
        while any(len(SEEN[name]) < EVENTS for name in names):
            assert time.monotonic() < deadline, {n: len(SEEN[n]) for n in names}
            await asyncio.sleep(0.05)
        assert all(set(SEEN[name].values()) == {1} for name in names), "an event ran twice"
        return min(EVENTS / (LAST[name] - started) for name in names)
    finally:
        await worker.stop(10)
        await ctx.bus("jobs").close()


async def run(urls: dict[str, str]) -> Result:
    found: dict[str, list[tuple[int, float]]] = {}
    for driver in DRIVERS:
        found[driver] = []
        for groups in GROUPS:
            found[driver].append((groups, await _rate(driver, urls[driver], groups)))
            print(
                f"  {driver}, {groups} groups: {found[driver][-1][1]:,.0f} events/s each",
                flush=True,
            )
    rows = [
        last_against_first(
            f"{driver}: each group's events/s with {GROUPS[-1]} groups",
            found[driver],
            RATE_TARGET,
        )
        for driver in DRIVERS
    ]
    # What the process does in all: every group runs every event, so the work grows with them.
    total = {d: [(groups, groups * rate) for groups, rate in found[d]] for d in DRIVERS}
    rows += [
        last_against_first(
            f"{driver}: runs/s of all {GROUPS[-1]} groups together", total[driver], 1.0
        )
        for driver in DRIVERS
    ]
    chart = {
        "name": "groups",
        "title": "Each listener group's rate against the number of groups",
        "x_label": "listener groups",
        "y_label": "events/s, the slowest group",
        "series": found,
        "log_x": False,
    }
    return curve(
        "groups",
        "Events: fan-out against the number of listener groups",
        f"{', '.join(map(str, GROUPS))} groups of one no-op listener in one ListenerRunner, "
        f"{EVENTS:,} events emitted at once; the slowest group's rate.",
        rows,
        [chart],
        found,
        notes=[
            "Every group runs every event: 50 groups are 50 times the work of one, on the same "
            "two cores. All groups together run more listener runs a second than one group "
            "alone (the runs/s rows), but each group's share of them falls as 1/N: a group's "
            "rate at 50 at 0.5x its rate alone would need the process to run 25 times as many "
            "a second as it does for one group. More groups need more worker processes "
            "(each group's consumers are shared across them).",
        ],
    )
