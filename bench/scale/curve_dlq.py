"""The dead letters an operator reads, against how many there are: `mega dlq list` (its count
and first 20 records) and the console's DLQ page (its count and first page of 50), at 100,
10,000 and 100,000 dead letters, on every bus driver. Target: under 200 ms at 100,000.

The lane is filled through the driver interface (bench/bench_dlq.py's fill: publish, fetch,
`dead_letter`); the CLI's listing is its own function with the booted context (the process
start is not the DLQ's cost), printing into a buffer; the page is a GET through the web app,
with an operator's token. Each figure is the median of REPEATS calls after a warm-up.
"""

from __future__ import annotations

import contextlib
import io
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from bench.bench_dlq import Doomed, _fill
from bench.report import Result, Row, row
from bench.scale import curve
from bench.scale.site import console
from mega.jobs.queue import JobQueue
from mega.runtime.dlq_cli import _list

SIZES = (100, 10_000, 100_000)
DRIVERS = ("nats", "redis", "postgres", "memory")
TARGET_MS = 200.0
REPEATS = 10
CLI_LIMIT = 20  # `mega dlq list`'s default --limit
BODY = "from bench.bench_dlq import Doomed\njobs = [Doomed]\n"


async def _median_ms(call: Callable[[], Awaitable[Any]]) -> float:
    await call()
    samples = []
    for _ in range(REPEATS):
        started = time.perf_counter()
        await call()
        samples.append((time.perf_counter() - started) * 1000)
    return statistics.median(samples)


async def _driver(driver: str, urls: dict[str, str]) -> dict[str, list[tuple[int, float]]]:
    figures: dict[str, list[tuple[int, float]]] = {"cli": [], "page": []}
    with tempfile.TemporaryDirectory(prefix="scale-dlq-") as tmp:
        async with console(Path(tmp), driver, urls, BODY) as (client, ctx, _):
            queue = JobQueue(ctx, "jobs")
            spec, lane = queue.spec(Doomed), queue.lane(Doomed)
            bus = ctx.bus("jobs")
            await bus.ensure(lane, apply_limits=False)
            stored = 0
            for size in SIZES:
                await _fill(bus, lane, spec, stored, size - stored)
                stored = size

                async def cli(size: int = size) -> None:
                    with contextlib.redirect_stdout(io.StringIO()) as out:
                        await _list(queue, Doomed, CLI_LIMIT)
                    assert f"{size} dead letter(s)" in out.getvalue(), out.getvalue()[:200]

                async def page(size: int = size) -> None:
                    answer = await client.get("/admin/dlq/Doomed")
                    assert answer.status_code == 200, answer.text[:300]
                    assert f'<span id="dlq-count">{size}</span>' in answer.text

                figures["cli"].append((size, await _median_ms(cli)))
                figures["page"].append((size, await _median_ms(page)))
                print(
                    f"  {driver} at {size:,}: cli {figures['cli'][-1][1]:.1f} ms, "
                    f"page {figures['page'][-1][1]:.1f} ms",
                    flush=True,
                )
    return figures


async def run(urls: dict[str, str]) -> Result:
    found = {driver: await _driver(driver, urls) for driver in DRIVERS}
    rows: list[Row] = []
    for what, label in (("cli", "mega dlq list"), ("page", "the DLQ page")):
        for driver in DRIVERS:
            points = dict(found[driver][what])
            at_most = points[SIZES[-1]]
            rows.append(
                row(
                    f"{driver}: {label} at {SIZES[-1]:,} dead letters (ms)",
                    at_most,
                    show=lambda v: f"{v:,.1f} ms",
                    baseline=points[SIZES[0]],
                    baseline_name=f"at {SIZES[0]}",
                    target=f"< {TARGET_MS:g} ms",
                    passed=at_most < TARGET_MS,
                )
            )
    charts = [
        {
            "name": f"dlq_{what}",
            "title": f"{label}: answer time against dead letters",
            "x_label": "dead letters in the lane",
            "y_label": "ms (median)",
            "series": {driver: found[driver][what] for driver in DRIVERS},
            "target": TARGET_MS,
        }
        for what, label in (("cli", "mega dlq list"), ("page", "The console's DLQ page"))
    ]
    return curve(
        "dlq",
        "Dead letters: the CLI and the page against the DLQ's size",
        f"{', '.join(f'{s:,}' for s in SIZES)} dead letters of one job on each driver; median of "
        f"{REPEATS} calls. `mega dlq list`: its count and first {CLI_LIMIT} records (the "
        "process start left out); the page: GET /admin/dlq/<job>, its count and first 50.",
        rows,
        charts,
        found,
    )
