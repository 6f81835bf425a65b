"""The operator console's dead-letter browser with 100,000 dead letters, on every bus driver.

    .venv/bin/python -m bench.bench_dlq [--dead 100000] [--repeats 20]

For each driver (nats, redis, postgres on private embedded servers, and memory), one job lane
is filled through the driver interface only: N jobs published in batches of 1,000, then
fetched by receivers (`fetch(100)`, a few at once) and each one stored as a dead letter with
`Receiver.dead_letter` (a fetched batch at once, asyncio.gather). With N = 1,000 dead letters,
then the same lane grown to N, each operation of the console is timed (the median of
`--repeats` calls):

- the first page: `dead_letters(lane, limit=50)`;
- a deep page: `dead_letters(lane, limit=50, before=<the seq of a record about half-way back>)`;
- find by id: `dead_letter(lane, <the id of one of the first jobs stored>)`;
- count: `count_dead(lane)`.

Each is held to <= 3x its time at 1,000 (it stays fast: an index or a range read, not a scan
of the records); count on PostgreSQL is reported only (it counts the lane's index entries,
there is no O(1) count). Each answer is checked: the first page is 50 records with strictly
descending seqs, the deep page 50 records all below `before`, find by id returns that job's
record, count the number stored. A check that fails fails its row. The fill rate (dead
letters stored per second, publish untimed) is context only.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from itertools import pairwise
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run by path (python bench/x.py): make `bench` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.bench_drivers import driver_context
from bench.report import Result, Row, print_table, result, row
from mega import Context, Job
from mega.drivers.base import Bus, Delivery, DlqRecord, Lane
from mega.jobs.queue import JobQueue
from mega.jobs.spec import JobSpec, encode_job
from mega.lanes.dlq import make_record

SMALL = 1_000  # the baseline: the lane with this many dead letters
PAGE = 50
TARGET = 3.0  # each operation at N <= this x its time at SMALL
PUBLISH_BATCH = 1_000
FETCH = 100
RECEIVERS = 4  # receivers storing dead letters at once while filling
DRIVERS = ("nats", "redis", "postgres", "memory")
REDIS_DLQ_MAXLEN = 100_000  # mega/drivers/redis/scripts.py: a Redis lane keeps this many


class Doomed(Job):
    """The job whose every message ends as a dead letter (it never runs: the bench settles
    each delivery with `dead_letter` itself)."""

    subject = "bench.doomed"
    bus = "jobs"
    concurrency = 1_000
    retries = 0

    async def run(self, payload: int, ctx: Context) -> None:  # pragma: no cover - never run
        raise AssertionError("not run")


def _ms(value: float) -> str:
    return f"{value:,.4f} ms"


async def _median_ms(call: Callable[[], Awaitable[Any]], repeats: int) -> tuple[float, Any]:
    """The median of `repeats` timed calls (after one untimed warm-up), and the last answer."""
    answer = await call()
    samples = []
    for _ in range(repeats):
        started = time.perf_counter()
        answer = await call()
        samples.append((time.perf_counter() - started) * 1000)
    return statistics.median(samples), answer


async def _fill(
    bus: Bus, lane: Lane, spec: JobSpec, first: int, count: int
) -> tuple[list[str], float]:
    """Store `count` more dead letters (payloads first..first+count-1) through the interface:
    publish, then fetch and `dead_letter` each. Returns the job ids in publish order and the
    seconds the dead-lettering took (the publish untimed)."""
    messages = [encode_job(spec, n) for n in range(first, first + count)]
    for start in range(0, count, PUBLISH_BATCH):
        stored = await bus.publish(lane, messages[start : start + PUBLISH_BATCH])
        assert all(stored), "a job was dropped as a duplicate"
    left = count
    receivers = [bus.receiver(lane, consumer="bench") for _ in range(RECEIVERS)]

    async def bury(receiver: Any) -> None:
        nonlocal left
        while left > 0:
            batch = await receiver.fetch(FETCH)
            left -= len(batch)
            await asyncio.gather(
                *(receiver.dead_letter(d, _record(d), terminate=False) for d in batch)
            )
        for other in receivers:
            other.wake()

    started = time.perf_counter()
    try:
        await asyncio.gather(*(bury(receiver) for receiver in receivers))
        seconds = time.perf_counter() - started
    finally:
        for receiver in receivers:
            await receiver.close()
    assert left == 0, f"{-left} deliveries more than published (redelivered?)"
    return [message.id for message in messages], seconds


async def _measure(
    bus: Bus, lane: Lane, old_id: str, middle_id: str, expect: int, repeats: int
) -> dict[str, Any]:
    """Time the four operations on the lane as it is; each with the check of its answer."""
    middle = await bus.dead_letter(lane, middle_id)
    assert middle is not None and "seq" in middle, f"{middle_id}: the half-way record not found"
    before = middle["seq"]
    first_ms, first = await _median_ms(lambda: bus.dead_letters(lane, limit=PAGE), repeats)
    deep_ms, deep = await _median_ms(
        lambda: bus.dead_letters(lane, limit=PAGE, before=before), repeats
    )
    find_ms, found = await _median_ms(lambda: bus.dead_letter(lane, old_id), repeats)
    count_ms, count = await _median_ms(lambda: bus.count_dead(lane), repeats)
    return {
        "first": (first_ms, _descending(first)),
        "deep": (deep_ms, _descending(deep) and all(r["seq"] < before for r in deep)),
        "find": (find_ms, found is not None and found["id"] == old_id and "seq" in found),
        "count": (count_ms, count == expect),
        "answers": {"count": count, "before": before},
    }


def _record(delivery: Delivery) -> DlqRecord:
    return make_record(
        delivery.subject,
        delivery.id,
        int(delivery.body),
        "BenchError",
        "dead on purpose",
        attempts=delivery.attempt,
        first_enqueued_at=delivery.enqueued_at_ms,
        worker="bench",
    )


def _descending(page: list[DlqRecord]) -> bool:
    """50 records, each with a seq, newest first."""
    seqs = [record.get("seq", -1) for record in page]
    return len(page) == PAGE and min(seqs) >= 0 and all(a > b for a, b in pairwise(seqs))


async def _driver(driver: str, url: str, dead: int, repeats: int) -> dict[str, Any]:
    ctx = await driver_context(driver, url)
    bus = ctx.bus("jobs")
    try:
        queue = JobQueue(ctx, "jobs")
        spec, lane = queue.spec(Doomed), queue.lane(Doomed)
        await bus.ensure(lane, apply_limits=False)
        ids, _ = await _fill(bus, lane, spec, 0, SMALL)
        old_id = ids[0]
        small = await _measure(bus, lane, old_id, ids[SMALL // 2], SMALL, repeats)
        more, seconds = await _fill(bus, lane, spec, SMALL, dead - SMALL)
        rate = (dead - SMALL) / seconds
        ids += more
        kept = min(dead, REDIS_DLQ_MAXLEN) if driver == "redis" else dead
        if kept < dead:  # Redis trimmed the oldest: look for one of the oldest it keeps
            old_id = ids[dead - kept + SMALL]
        large = await _measure(bus, lane, old_id, ids[dead // 2], kept, repeats)
        print(f"  {driver}: filled at {rate:,.0f}/s; {_summary(small)} -> {_summary(large)}")
        return {"small": small, "large": large, "rate": rate, "kept": kept}
    finally:
        await bus.close()


def _summary(figures: dict[str, Any]) -> str:
    return ", ".join(f"{op} {figures[op][0]:.3f} ms" for op in ("first", "deep", "find", "count"))


@contextmanager
def embedded_servers(tmp: Path) -> Iterator[dict[str, str]]:
    """The embedded servers, each on a private port under `tmp`, stopped after."""
    from mega.drivers.nats.embedded import EmbeddedNats
    from mega.drivers.postgres.embedded import EmbeddedPostgres
    from mega.drivers.redis.embedded import EmbeddedRedis

    started: list[Any] = []
    try:
        urls = {}
        for name, server in (
            ("nats", EmbeddedNats(data_dir=tmp / "nats")),
            ("redis", EmbeddedRedis(data_dir=tmp / "redis")),
            ("postgres", EmbeddedPostgres(tmp / "postgres", fast=True)),
        ):
            server.start()
            started.append(server)
            urls[name] = server.url
        yield urls
    finally:
        for server in started:
            server.stop()


OPERATIONS = (
    ("first", f"first page, dead_letters(limit={PAGE})"),
    ("deep", f"deep page, dead_letters(limit={PAGE}, before=<seq half-way back>)"),
    ("find", "find by id, dead_letter(<an old record's job id>)"),
    ("count", "count_dead"),
)
NOTES = {
    ("postgres", "count"): "postgres count: `SELECT count(*) ... WHERE lane = %s` reads every "
    "entry of the lane's (lane, seq) index (PostgreSQL keeps no O(1) row count), so it grows "
    "with N: reported, no target",
}


def _rows(driver: str, figures: dict[str, Any], dead: int) -> tuple[list[Row], list[str]]:
    rows, notes = [], []
    for op, label in OPERATIONS:
        small_ms, small_ok = figures["small"][op]
        large_ms, large_ok = figures["large"][op]
        checked = small_ok and large_ok
        if (driver, op) == ("postgres", "count"):
            target, passed = "reported", None if checked else False
        else:
            target = f"<= {TARGET:g}x"
            passed = checked and large_ms <= TARGET * small_ms
        rows.append(
            row(
                f"{driver}: {label} at {dead:,} (ms)" + ("" if checked else " [WRONG ANSWER]"),
                large_ms,
                show=_ms,
                baseline=small_ms,
                baseline_name=f"at {SMALL:,}",
                target=target,
                passed=passed,
            )
        )
        if (driver, op) in NOTES:
            notes.append(NOTES[driver, op])
    rows.append(row(f"{driver}: fill, dead letters stored per second", figures["rate"]))
    return rows, notes


async def _bench(dead: int, repeats: int) -> Result:
    assert dead >= 2 * SMALL, f"--dead must be at least {2 * SMALL}"
    figures: dict[str, dict[str, Any]] = {}
    with (
        tempfile.TemporaryDirectory(prefix="bench-dlq-") as tmp,
        embedded_servers(Path(tmp)) as urls,
    ):
        for driver in DRIVERS:
            figures[driver] = await _driver(driver, urls.get(driver, ""), dead, repeats)
    rows, notes = [], []
    for driver in DRIVERS:
        more_rows, more_notes = _rows(driver, figures[driver], dead)
        rows += more_rows
        notes += more_notes
    if dead > REDIS_DLQ_MAXLEN:
        notes.append(f"redis keeps {REDIS_DLQ_MAXLEN:,} dead letters per lane (oldest trimmed)")
    notes.append(
        "every answer checked: first page 50 records, seqs strictly descending; deep page 50, "
        "every seq below `before`; find by id that job's record; count the number stored"
    )
    res = result(
        "dlq",
        "Dead-letter browser: 1,000 vs 100,000 dead letters, every driver",
        f"one job lane per driver filled with {SMALL:,} then {dead:,} dead letters through the "
        f"bus interface; each operation the median of {repeats} calls; private embedded "
        "nats, redis (valkey) and postgres (fast=True) servers",
        rows,
        notes=notes,
        data={
            driver: {
                "fill_per_s": f["rate"],
                **{
                    f"{op}_ms": {"small": f["small"][op][0], "large": f["large"][op][0]}
                    for op, _ in OPERATIONS
                },
            }
            for driver, f in figures.items()
        },
    )
    print_table(res)
    return res


def run(dead: int = 100_000, repeats: int = 20) -> Result:
    return asyncio.run(_bench(dead, repeats))


def _main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--dead", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    return 0 if run(args.dead, args.repeats)["passed"] else 1


if __name__ == "__main__":
    sys.exit(_main())
