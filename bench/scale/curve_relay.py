"""The outbox relay's rate against the rows waiting for it: 20,000 and 200,000 committed
rows, with the application's database on SQLite and on PostgreSQL, the events going to NATS.
Target: the rate with 200,000 waiting at least 0.8x the rate with 20,000 (taking a batch
stays an index read, whatever waits behind it).

The rows are committed first (untimed, in transactions of 2,000, as a backlog builds up); the
rate is how long one relay (`relay_once` in a loop) takes to publish the first MEASURED rows.
Then the rest are relayed (untimed), so the next point starts from an empty outbox.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from bench.bench_outbox import BATCH, _commit
from bench.report import Result
from bench.scale import curve, last_against_first
from mega import Context
from mega.drivers.nats import NatsBus
from mega.runtime import OutboxRelay
from mega.runtime.bootstrap import connect_database
from mega.settings import BusSpec

PENDING = (20_000, 200_000)
MEASURED = 20_000
RATE_TARGET = 0.8


def _databases(urls: dict[str, str], folder: Path) -> dict[str, str]:
    postgres = urls["postgres"].replace("postgresql://", "postgresql+psycopg://", 1)
    return {"sqlite": f"sqlite:///{folder / 'relay.db'}", "postgres": postgres}


async def _rates(nats_url: str, db_url: str) -> list[tuple[int, float]]:
    bus = await NatsBus.connect("bench", BusSpec(driver="nats", url=nats_url))
    ctx = Context(instance_id="bench", database=await connect_database(db_url))
    ctx.buses["bench"] = bus
    rates = []
    try:
        relay = OutboxRelay(ctx, batch=BATCH)
        for pending in PENDING:
            await _commit(ctx, pending)
            relayed, started = 0, time.perf_counter()
            while relayed < MEASURED:
                relayed += await relay.relay_once()
            rates.append((pending, relayed / (time.perf_counter() - started)))
            while await relay.relay_once():
                pass
    finally:
        await bus.close()
        ctx.db.dispose()
    return rates


async def run(urls: dict[str, str]) -> Result:
    found: dict[str, list[tuple[int, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="scale-relay-") as tmp:
        for name, db_url in _databases(urls, Path(tmp)).items():
            found[name] = await _rates(urls["nats"], db_url)
            print(
                f"  {name}: " + ", ".join(f"{r:,.0f} rows/s with {p:,}" for p, r in found[name]),
                flush=True,
            )
    rows = [
        last_against_first(
            f"{name}: rows relayed per second with {PENDING[-1]:,} waiting", points, RATE_TARGET
        )
        for name, points in found.items()
    ]
    chart = {
        "name": "relay",
        "title": "Outbox relay rate against the rows waiting",
        "x_label": "committed rows waiting",
        "y_label": "rows relayed per second",
        "series": found,
    }
    return curve(
        "relay",
        "The outbox relay against the rows waiting for it",
        f"{', '.join(f'{p:,}' for p in PENDING)} committed rows on SQLite and on PostgreSQL; one "
        f"relay (batches of {BATCH}) to NATS, its rate over the first {MEASURED:,}.",
        rows,
        [chart],
        found,
    )
