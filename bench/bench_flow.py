"""Flow control: what a rate limit and a cap per key cost a job that they do not hold back.

    .venv/bin/python -m bench.bench_flow [--jobs 20000]

N no-op jobs on the memory driver (so that the limiter's cost is not hidden behind a broker's),
drained by one consume loop (concurrency 200) without a limit, then with a `rate_limit` high
enough never to hold a job back (1,000,000 a second), counted in a private Redis: each fetch
then asks the shared log for a start per job it brought and stamps them once they began, two
round trips per fetch; then the same limit counted per key, and a `key_concurrency` never
reached (each run takes a lease of its key and drops it at its end), the jobs all of one key.
Reported: the rates, their ratios to no limit, and each one's cost per job in microseconds.
Rounds alternate them, the best of each kept (the machine's pace moves). Every job is checked
to have run exactly once.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run by path (python bench/x.py): make `bench` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.bench_drivers import Noop, _drain, driver_context
from bench.report import Result, print_table, result, row
from mega.context import CacheAdapter

ROUNDS = 3


class Free(Noop):
    subject = "bench.free"


class Limited(Free):
    subject = "bench.limited"
    rate_limit = {"limit": 1_000_000, "period_s": 1.0}


class PerKey(Free):
    subject = "bench.perkey"
    rate_limit = {"limit": 1_000_000, "period_s": 1.0, "per": "key"}


class KeyCapped(Free):
    subject = "bench.capped"
    key_concurrency = 1_000


async def _bench(jobs: int) -> Result:
    from redis.asyncio import Redis

    from mega.drivers.redis.embedded import EmbeddedRedis

    with tempfile.TemporaryDirectory(prefix="bench-flow-") as tmp:
        server = EmbeddedRedis(Path(tmp) / "redis").start()
        client = Redis.from_url(server.url)
        try:
            free = limited = per_key = capped = 0.0
            for _ in range(ROUNDS):
                ctx = await driver_context("memory", "")
                ctx.caches["main"] = CacheAdapter("main", server.url, client)
                free = max(free, await _drain(ctx, jobs, Free))
                limited = max(limited, await _drain(ctx, jobs, Limited))
                per_key = max(per_key, await _drain(ctx, jobs, PerKey, key="tenant"))
                capped = max(capped, await _drain(ctx, jobs, KeyCapped, key="tenant"))
        finally:
            await client.aclose()
            server.stop()

    def cost_us(rate: float) -> float:
        return (1 / rate - 1 / free) * 1_000_000

    def cost_row(label: str, rate: float) -> dict[str, Any]:
        return row(label, cost_us(rate), show=lambda v: f"{v:,.1f} us")

    def rate_row(label: str, rate: float) -> dict[str, Any]:
        return row(label, rate, baseline=free, baseline_name="no limit")

    res = result(
        "flow",
        "Flow control: the cost of a rate limit and of a cap per key",
        f"{jobs:,} no-op jobs per run on the memory driver, concurrency 200, one consume loop; "
        "the limit's log in a private Redis-compatible server",
        [
            row("no limit (jobs/s)", free),
            rate_row("rate_limit 1,000,000/s, never reached (jobs/s)", limited),
            cost_row("the limiter's cost per job (us)", limited),
            rate_row('the same limit "per": "key", one key (jobs/s)', per_key),
            cost_row("its cost per job (us)", per_key),
            rate_row("key_concurrency 1,000, never reached, one key (jobs/s)", capped),
            cost_row("its cost per job (us)", capped),
        ],
        notes=[
            "a rate limit costs two Redis round trips per fetch (a grant for what it brought, "
            "then the stamp once they began), not per job: a fetch brings up to `concurrency`; "
            "per key, two per key a fetch brought",
            "key_concurrency takes its leases with one round trip per key a fetch brought, and "
            "drops those of the runs that ended together, one pipeline at a time",
            f"best of {ROUNDS} alternated rounds each; every job checked to have run once",
        ],
        data={
            "free_per_s": free,
            "limited_per_s": limited,
            "cost_us": cost_us(limited),
            "per_key_per_s": per_key,
            "per_key_cost_us": cost_us(per_key),
            "capped_per_s": capped,
            "capped_cost_us": cost_us(capped),
        },
    )
    print_table(res)
    return res


def run(jobs: int = 20_000) -> Result:
    return asyncio.run(_bench(jobs))


def _main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--jobs", type=int, default=20_000)
    return 0 if run(parser.parse_args().jobs)["passed"] else 1


if __name__ == "__main__":
    sys.exit(_main())
