"""The operator console's overview against how many job queues it shows: 1, 10 and 50, on
every bus driver. Each queue's row reads its stats, its pause and its workers from the bus.
Target: 50 queues in under 200 ms (what a page an operator reloads must answer in).

The figure is GET /admin/ through the web app with an operator's token: the median of REPEATS
calls after a warm-up (which also makes every queue exist on the bus).
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

from bench.report import Result, Row, row
from bench.scale import curve
from bench.scale.site import console

QUEUES = (1, 10, 50)
DRIVERS = ("nats", "redis", "postgres", "memory")
TARGET_MS = 200.0
REPEATS = 10
BODY = """
from mega import Job


def _queue(n):
    class Queue(Job):
        subject = f"scale.queue{{n}}"
        bus = "jobs"
        name = f"Queue{{n:02d}}"

        async def run(self, payload, ctx): ...

    return Queue


jobs = [_queue(n) for n in range({count})]
"""


async def _answer_ms(driver: str, urls: dict[str, str], count: int) -> float:
    with tempfile.TemporaryDirectory(prefix="scale-overview-") as tmp:
        async with console(Path(tmp), driver, urls, BODY.format(count=count)) as (client, *_):
            answer = await client.get("/admin/")
            assert answer.status_code == 200, answer.text[:300]
            assert answer.text.count("<tr data-lane=") == count
            samples = []
            for _ in range(REPEATS):
                started = time.perf_counter()
                answer = await client.get("/admin/")
                samples.append((time.perf_counter() - started) * 1000)
                assert answer.status_code == 200
    return statistics.median(samples)


async def run(urls: dict[str, str]) -> Result:
    found: dict[str, list[tuple[int, float]]] = {}
    for driver in DRIVERS:
        found[driver] = []
        for count in QUEUES:
            found[driver].append((count, await _answer_ms(driver, urls, count)))
            print(f"  {driver}, {count} queues: {found[driver][-1][1]:.1f} ms", flush=True)
    rows: list[Row] = []
    for driver in DRIVERS:
        points = dict(found[driver])
        rows.append(
            row(
                f"{driver}: the overview with {QUEUES[-1]} job queues (ms)",
                points[QUEUES[-1]],
                show=lambda v: f"{v:,.1f} ms",
                baseline=points[QUEUES[0]],
                baseline_name="with 1",
                target=f"< {TARGET_MS:g} ms",
                passed=points[QUEUES[-1]] < TARGET_MS,
            )
        )
    chart = {
        "name": "overview",
        "title": "The console's overview: answer time against job queues",
        "x_label": "job queues",
        "y_label": "ms (median)",
        "series": found,
        "target": TARGET_MS,
        "log_x": False,
    }
    return curve(
        "overview",
        "The operator console's overview against the number of job queues",
        f"{', '.join(map(str, QUEUES))} job queues on each driver, no worker running; GET "
        f"/admin/, median of {REPEATS} calls.",
        rows,
        [chart],
        found,
    )
