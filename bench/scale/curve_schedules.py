"""Schedule lateness against how many schedules one scheduler runs: 1, 100, 1,000 and 10,000
schedules, each every second (`* * * * * *`) with the cluster lock (a Lua claim per run on the
Redis, as production runs them). Target: p99 under 20 ms up to 1,000 schedules.

Lateness is when a run starts minus its planned instant. Each point runs TICKS seconds after a
warm-up second; its p99 is over every run that started in them (N x TICKS samples when the
scheduler keeps up; fewer, and later, when it does not).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

from redis.asyncio import Redis

from bench.bench_schedule_lateness import LOCK_TTL_MS, _probe
from bench.report import Result, Row, percentile, row
from bench.scale import curve
from mega.context import CacheAdapter, Context
from mega.schedules.locks import RedLock
from mega.schedules.scheduler import Scheduler

COUNTS = (1, 100, 1_000, 10_000)
TARGET_P99_MS = 20.0
TARGET_UP_TO = 1_000
TICKS = 5
WARMUP_S = 1.5


async def _lateness(redis_url: str, count: int) -> tuple[list[float], float]:
    """Every run's lateness (ms) in TICKS seconds after the warm-up, and the start's seconds
    (register and start)."""
    client = Redis.from_url(redis_url)
    samples: list[float] = []
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
            scheduler.register(_probe(f"Every{n:05d}", lock, samples))
        await scheduler.start()
        start_s = time.perf_counter() - began
        try:
            await asyncio.sleep(WARMUP_S)
            kept_from = len(samples)
            await asyncio.sleep(TICKS)
            kept = samples[kept_from:]
        finally:
            await scheduler.stop()
    finally:
        await client.aclose()
    return kept, start_s


async def run(urls: dict[str, str]) -> Result:
    p99: list[tuple[int, float]] = []
    rows: list[Row] = []
    data: dict[str, Any] = {}
    for count in COUNTS:
        kept, start_s = await _lateness(urls["redis"], count)
        value = percentile(kept, 99)
        p99.append((count, value))
        data[str(count)] = {"runs": len(kept), "p50": percentile(kept, 50), "p99": value,
                            "start_s": start_s}  # fmt: skip
        print(f"  {count:,} schedules: {len(kept):,} runs, p99 {value:.1f} ms, "
              f"started in {start_s:.1f} s", flush=True)  # fmt: skip
        held = count <= TARGET_UP_TO
        rows.append(row(
            f"{count:,} schedules: run start lateness p99 ({len(kept):,} runs of "
            f"{count * TICKS:,} planned)", value, show=lambda v: f"{v:,.1f} ms",
            baseline=p99[0][1], baseline_name="1 schedule",
            target=f"< {TARGET_P99_MS:g} ms" if held else "reported",
            passed=(value < TARGET_P99_MS) if held else None,
        ))  # fmt: skip
    chart = {
        "name": "schedules", "title": "Schedule lateness p99 against schedules in one scheduler",
        "x_label": "schedules, each every second", "y_label": "ms, p99 of run starts",
        "series": {"with the lock": p99}, "target": TARGET_P99_MS,
    }  # fmt: skip
    return curve(
        "schedules",
        "Schedules: lateness against how many one scheduler runs",
        f"{', '.join(f'{c:,}' for c in COUNTS)} schedules `* * * * * *`, each with the cluster "
        f"lock (its own key), in one Scheduler on the embedded Redis; {TICKS} s measured after "
        f"{WARMUP_S:g} s of warm-up.",
        rows, [chart], data,
    )  # fmt: skip
