"""The outbox: relay drain vs bare publish_async, commit-to-listener-start latency, and three
listener groups each receiving every event exactly once.

    .venv/bin/python -m bench.bench_outbox [--rows 20000] [--rate 200] [--seconds 10]

A private nats-server (file storage), SQLite in a temporary directory, no Redis. Drain: the
baseline publishes 20,000 payloads with `publish_async` and gathers every PubAck, on a stream of
its own (after an untimed warm-up); then one relay publishes 20,000 committed outbox rows of
the same payloads (batches of DEFAULT_BATCH, each marked after its PubAcks). Latency: a
steady rate of commits (one outbox row each) while a relay and one listener group run in the
same process; from the commit returning to the listener's `run` starting. Exactly once: three
groups consume the 20,000 events of the drain.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run by path (python bench/x.py): make `bench` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from nats.js.api import StreamConfig

from bench.report import Result, ms, percentile, print_table, result, row
from mega import Context, Event, Listener, ListenerRunner, ReceivedEvent, outbox
from mega.drivers.nats import NatsBus
from mega.runtime import OutboxRelay
from mega.runtime.bootstrap import connect_database
from mega.settings import BusSpec
from mega.transactional.relay import DEFAULT_BATCH

DRAIN_TARGET = 0.5  # relay drain >= 0.5 x bare publish_async
LATENCY_TARGET_MS = 50.0  # commit-to-listener-start p99 at 200 signups/s
BATCH = DEFAULT_BATCH


class Signed(Event):
    name = "bench.signed_up"
    bus = "bench"


STARTED: dict[str, float] = {}  # event id -> when group "first" started it (perf_counter)
COMMITTED: dict[str, float] = {}  # event id -> when its commit returned
SEEN: dict[str, dict[str, int]] = {}


class Recorder(Listener):
    event = Signed
    concurrency = 200

    async def run(self, event: ReceivedEvent, ctx: Context) -> None:
        seen = SEEN.setdefault(self.group, {})
        seen[event.id] = seen.get(event.id, 0) + 1
        if self.group == "first" and event.id.startswith("late"):
            STARTED[event.id] = time.perf_counter()


class First(Recorder):
    group = "first"


class Second(Recorder):
    group = "second"


class Third(Recorder):
    group = "third"


async def _context(url: str, db_url: str) -> Context:
    bus = await NatsBus.connect("bench", BusSpec(driver="nats", url=url))
    ctx = Context(instance_id="bench", database=await connect_database(db_url))
    ctx.buses["bench"] = bus
    return ctx


async def _commit(ctx: Context, count: int) -> list[str]:
    def write(session: Any, first: int, last: int) -> list[str]:
        return [
            outbox.add(session, Signed, {"n": n, "email": f"u{n}@example.com"})
            for n in range(first, last)
        ]

    ids: list[str] = []
    for first in range(0, count, 2000):  # a few big transactions, as a backlog builds up
        last = min(first + 2000, count)
        ids += await ctx.db.run(lambda session, a=first, b=last: write(session, a, b))
    return ids


async def _bare_publish(ctx: Context, payloads: list[bytes], *, stream: str) -> float:
    js = ctx.bus("bench").js
    subject = stream.lower()
    await js.add_stream(StreamConfig(name=stream, subjects=[subject]))
    started = time.perf_counter()
    futures = [await js.publish_async(subject, body) for body in payloads]
    await asyncio.gather(*futures)
    return len(payloads) / (time.perf_counter() - started)


async def _bench(rows: int, rate: float, seconds: float) -> Result:
    from mega.drivers.nats.embedded import EmbeddedNats

    with tempfile.TemporaryDirectory(prefix="bench-outbox-") as tmp_name:
        tmp = Path(tmp_name)
        server = EmbeddedNats(tmp / "nats").start()
        ctx = await _context(server.url, f"sqlite:///{tmp / 'bench.db'}")
        try:
            # Drain: a backlog of committed rows, one relay; the baseline publishes the same
            # payloads first, after an untimed warm-up of the server (its first publishes are slow).
            ids = await _commit(ctx, rows)
            payloads = [b'{"n":%d,"email":"u%d@example.com"}' % (n, n) for n in range(rows)]
            await _bare_publish(ctx, payloads[:5000], stream="WARMUP")
            bare = await _bare_publish(ctx, payloads, stream="BARE")
            relay = OutboxRelay(ctx, batch=BATCH)
            started = time.perf_counter()
            while await relay.relay_once():
                pass
            drain = rows / (time.perf_counter() - started)

            # Exactly once: three groups consume the drained events.
            listeners = ListenerRunner(ctx)
            for group in (First, Second, Third):
                listeners.register(group)
            started = time.perf_counter()
            await listeners.start()
            deadline = time.monotonic() + 120
            while any(len(SEEN.get(g, {})) < rows for g in ("first", "second", "third")):
                assert time.monotonic() < deadline, {g: len(v) for g, v in SEEN.items()}
                await asyncio.sleep(0.05)
            fan_out_s = time.perf_counter() - started
            await asyncio.sleep(1.0)  # a duplicate would land by now
            once = all(
                sorted(SEEN[g]) == sorted(ids) and set(SEEN[g].values()) == {1}
                for g in ("first", "second", "third")
            )

            # Latency: steady commits with a relay and the listeners running.
            await relay.start()
            interval = 1 / rate
            next_at = time.perf_counter()
            for n in range(int(rate * seconds)):
                next_at += interval
                await asyncio.sleep(max(0.0, next_at - time.perf_counter()))
                event_id = f"late{n}"

                def one(session: Any, event_id: str = event_id) -> str:
                    payload = {"n": -1, "email": "late@example.com"}
                    return outbox.add(session, Signed, payload, id=event_id)

                await ctx.db.run(one)
                COMMITTED[event_id] = time.perf_counter()
            deadline = time.monotonic() + 30
            while len(STARTED) < len(COMMITTED):
                assert time.monotonic() < deadline, f"{len(STARTED)} of {len(COMMITTED)} started"
                await asyncio.sleep(0.05)
            # A listener may start before the commit call has returned to its caller: 0 then.
            latencies = [max(0.0, STARTED[i] - COMMITTED[i]) * 1000 for i in COMMITTED]
            await relay.stop()
            await listeners.stop(5)
        finally:
            with contextlib.suppress(Exception):
                await ctx.bus("bench").native.close()
            if ctx.database is not None:
                ctx.database.dispose()
            server.stop()
    p50, p99 = percentile(latencies, 50), percentile(latencies, 99)
    res = result(
        "outbox",
        "The outbox: relay drain, commit-to-listener latency, three groups exactly once",
        f"{rows:,} committed rows on SQLite, relay batches of {BATCH}; {rate:.0f} commits/s "
        f"for {seconds:.0f} s; private nats-server, file storage",
        [
            row("bare publish_async, gathered (msgs/s)", bare),
            row(
                "relay drain of the backlog (rows/s)",
                drain,
                baseline=bare,
                baseline_name="publish_async",
                target=f">= {DRAIN_TARGET}x",
                passed=drain / bare >= DRAIN_TARGET,
            ),
            row("commit to listener start p50", p50, show=ms),
            row(
                f"commit to listener start p99 at {rate:.0f}/s",
                p99,
                show=ms,
                target=f"< {LATENCY_TARGET_MS:.0f} ms",
                passed=p99 < LATENCY_TARGET_MS,
            ),
            row(
                "three groups: events each received", rows, target="each exactly once", passed=once
            ),
            row("three groups: consume of the backlog (events/s per group)", rows / fan_out_s),
        ],
        notes=[
            "drain: rows taken in insertion order, published pipelined, marked after the PubAcks, "
            "one SQLite transaction per batch",
            "latency: the relay runs in the committing process, so each commit wakes it at once; "
            "in `mega worker` beside a web app, the web announces each commit on NATS",
            f"load average {os.getloadavg()[0]:.2f} after the run",
        ],
        data={
            "drain_rows_per_s": drain,
            "bare_msgs_per_s": bare,
            "latency_ms": {"p50": p50, "p99": p99},
        },
    )
    print_table(res)
    return res


def run(rows: int = 20_000, rate: float = 200.0, seconds: float = 10.0) -> Result:
    return asyncio.run(_bench(rows, rate, seconds))


def _main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--rate", type=float, default=200.0)
    parser.add_argument("--seconds", type=float, default=10.0)
    options = parser.parse_args()
    return 0 if run(options.rows, options.rate, options.seconds)["passed"] else 1


if __name__ == "__main__":
    sys.exit(_main())
