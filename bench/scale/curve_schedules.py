"""Schedule lateness against how many schedules one scheduler runs: 1, 100, 1,000 and 10,000,
each with the cluster lock (a Lua claim per run on the Redis, as production runs them), on the
client a host makes (mega.runtime.bootstrap.connect_redis: a pool of 64 connections).

Two loads, since "N schedules" means two things:
- spread: each schedule every minute, at its own second (schedule n at second n mod 60), as
  a real timetable spreads its jobs: N/60 ticks a second. Target: p99 under 20 ms up to 1,000.
- all at once: each schedule every second (`* * * * * *`), so N ticks fall on every second:
  the worst case, a burst of N claims each second. Reported: what one process can claim.

Lateness is when a run starts minus its planned instant. The runs kept are those planned in a
window of whole seconds after a warm-up, however late they start: one whole minute for the
spread load (every schedule runs once in it), BURST_S seconds for the burst.
"""

from __future__ import annotations

import asyncio
import math
import time
import uuid
from typing import Any

from bench.bench_schedule_lateness import LOCK_TTL_MS, _probe
from bench.report import Result, Row, percentile, row
from bench.scale import curve
from mega.context import CacheAdapter, Context
from mega.runtime.bootstrap import connect_redis
from mega.runtime.hosts import freeze_startup_heap
from mega.schedules.locks import RedLock
from mega.schedules.scheduler import Scheduler

COUNTS = (1, 100, 1_000, 10_000)
BURST_COUNTS = (1, 100, 1_000)  # 10,000 claims each second is beyond one process (see notes)
TARGET_P99_MS = 20.0
TARGET_UP_TO = 1_000
SPREAD_S = 60.0
BURST_S = 5.0
WARMUP_S = 1.5
LATE_RUNS_S = 3.0  # after the window, how long its last ticks' runs may take to start


async def _lateness(redis_url: str, count: int, spread: bool) -> tuple[list[float], float]:
    """The lateness (ms) of every run planned in the measured window after the warm-up, and
    the start's seconds (register and start)."""
    client = await connect_redis("main", redis_url)
    samples: list[float] = []
    instants: list[float] = []
    try:
        ctx = Context(
            instance_id="bench",
            caches={"main": CacheAdapter("main", redis_url, client)},
            locks={"main": RedLock("main", [client])},
        )
        scheduler = Scheduler(ctx, stop_timeout_s=10.0)
        run_id = uuid.uuid4().hex[:8]
        began = time.perf_counter()
        for n in range(count):
            lock: Any = {"lock": "main", "ttl": LOCK_TTL_MS, "key": f"bench:scale:{run_id}:{n}"}
            probe = _probe(f"Every{n:05d}", lock, samples, instants)
            if spread:
                probe.cron = f"{n % 60} * * * * *"
            scheduler.register(probe)
        await scheduler.start()
        start_s = time.perf_counter() - began
        freeze_startup_heap()  # as a scheduler host does once started
        try:
            await asyncio.sleep(WARMUP_S)
            window_from = math.ceil(time.time())  # the next whole second
            window_to = window_from + (SPREAD_S if spread else BURST_S)
            await asyncio.sleep(window_to + LATE_RUNS_S - time.time())
            kept = [
                late
                for late, at in zip(samples, instants, strict=True)
                if window_from <= at < window_to
            ]
        finally:
            await scheduler.stop()
    finally:
        await client.aclose()
    return kept, start_s


async def _series(
    redis_url: str, counts: tuple[int, ...], spread: bool, data: dict[str, Any]
) -> list[tuple[int, float]]:
    p99: list[tuple[int, float]] = []
    load = "spread" if spread else "at once"
    for count in counts:
        kept, start_s = await _lateness(redis_url, count, spread)
        value = percentile(kept, 99)
        p99.append((count, value))
        planned = count if spread else count * int(BURST_S)
        data[f"{load} {count}"] = {
            "runs": len(kept),
            "planned": planned,
            "p50": percentile(kept, 50),
            "p99": value,
            "start_s": start_s,
        }
        print(
            f"  {load}, {count:,} schedules: {len(kept):,} runs of {planned:,}, "
            f"p99 {value:.1f} ms, started in {start_s:.1f} s",
            flush=True,
        )
    return p99


async def run(urls: dict[str, str]) -> Result:
    data: dict[str, Any] = {}
    spread = await _series(urls["redis"], COUNTS, True, data)
    burst = await _series(urls["redis"], BURST_COUNTS, False, data)
    rows: list[Row] = []
    for count, value in spread:
        runs = data[f"spread {count}"]["runs"]
        held = count <= TARGET_UP_TO
        rows.append(
            row(
                f"{count:,} schedules, each every minute at its own second: run start lateness p99 "
                f"({runs:,} runs of {count:,} planned)",
                value,
                show=lambda v: f"{v:,.1f} ms",
                baseline=spread[0][1],
                baseline_name="1 schedule",
                target=f"< {TARGET_P99_MS:g} ms" if held else "reported",
                passed=(value < TARGET_P99_MS) if held else None,
            )
        )
    for count, value in burst:
        figures = data[f"at once {count}"]
        rows.append(
            row(
                f"{count:,} schedules, all every second: run start lateness p99 "
                f"({figures['runs']:,} runs of {figures['planned']:,} planned)",
                value,
                show=lambda v: f"{v:,.1f} ms",
                baseline=burst[0][1],
                baseline_name="1 schedule",
                target="reported",
                passed=None,
            )
        )
    chart = {
        "name": "schedules",
        "title": "Schedule lateness p99 against schedules in one scheduler",
        "x_label": "schedules in one scheduler",
        "y_label": "ms, p99 of run starts",
        "series": {"each every minute, spread": spread, "each every second, at once": burst},
        "target": TARGET_P99_MS,
    }
    return curve(
        "schedules",
        "Schedules: lateness against how many one scheduler runs",
        f"{', '.join(f'{c:,}' for c in COUNTS)} schedules, each with the cluster lock (its own "
        "key) in one Scheduler on the embedded Redis, through a host's client (64 connections): "
        f"each every minute at its own second, measured over {SPREAD_S:g} s; then "
        f"{', '.join(f'{c:,}' for c in BURST_COUNTS)} each every second, over {BURST_S:g} s; "
        f"{WARMUP_S:g} s of warm-up before each.",
        rows,
        [chart],
        data,
        notes=[
            "All at once, every schedule's claim, run, audit record and release fall in the "
            "same second, one after another on one event loop: the p99 is how long the last "
            "of them waits, so it grows with the count. Spread as a timetable spreads them, "
            "each second holds a sixtieth of them.",
        ],
    )
