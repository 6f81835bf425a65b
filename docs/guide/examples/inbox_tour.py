"""The inboxes from a terminal: one signup event delivered twice to the sample's two groups whose
effects must happen once.

    .venv/bin/python docs/guide/examples/inbox_tour.py

SignupStatsListener (`inbox = "main"`) counts the e-mail domain with `event.inbox.apply`: the
count and the inbox mark are one Lua script. WelcomeCreditListener (`inbox = "db"`) writes a
credit row with `event.db.run`: the row and the inbox mark are one transaction. The second
delivery comes after the bus forgot the event's id, as from a relay back after the dedup window
or a requeue by hand: both groups skip it, and each effect is still there once.

The bus and Redis are mega.testing's, in this process; the database is SQLite in a temporary
folder, brought to the framework's newest migration (its `mega_inbox` table).
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))  # the sample's `app` package, as the mega command has it

from sqlalchemy import func, select  # noqa: E402

from app.events.listeners import STATS_KEY, SignupStatsListener, WelcomeCreditListener  # noqa: E402
from app.events.signups import UserSignedUp  # noqa: E402
from app.services.signups import Credit, create_tables  # noqa: E402
from mega import Database, EventBus  # noqa: E402
from mega.drivers.memory import MemoryBus  # noqa: E402
from mega.runtime.migrate import upgrade  # noqa: E402
from mega.testing import drain, memory_context  # noqa: E402

GROUPS = [SignupStatsListener, WelcomeCreditListener]
EVENT_ID = "signup-1"


async def main(folder: str) -> None:
    ctx = memory_context("jobs", caches=["main"])
    ctx.database = db = Database(f"sqlite:///{folder}/tour.db")
    upgrade(db)  # mega_inbox, as `mega db upgrade` makes it
    create_tables(db)  # the sample's demo_credits
    bus = EventBus(ctx, "jobs")
    payload = {"signup_id": 1, "email": "ada@example.com"}
    for delivery in ("first delivery", "redelivered"):
        ctx.bus("jobs", MemoryBus).native.dedup.clear()  # the dedup window has passed
        await bus.emit(UserSignedUp, payload, id=EVENT_ID)
        report = await drain(ctx, listeners=GROUPS)
        outcomes = [
            f"{group.group} {'skipped' if report.count(group.group, 'skip') else 'ran'}"
            for group in GROUPS
        ]
        print(f"{delivery + ':':16} {', '.join(outcomes)}")
    counted = await ctx.cache("main").native.hget(STATS_KEY, "example.com")
    rows = await db.run(lambda session: session.scalar(select(func.count(Credit.id))))
    print(f"example.com counted {counted} time(s); {rows} credit row(s)")
    db.dispose()


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as temporary:
        asyncio.run(main(temporary))
