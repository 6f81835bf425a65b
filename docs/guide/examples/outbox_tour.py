"""The transactional outbox from a terminal: a signup that commits, one that rolls back.

    .venv/bin/python docs/guide/examples/outbox_tour.py            # two signups, then the outbox
    .venv/bin/python docs/guide/examples/outbox_tour.py stats      # the outbox only

Each signup writes its row and its event's outbox row in one transaction (SignupService,
app/services/signups.py). The committed one leaves one pending outbox row for a relay (in every
`mega worker`) to publish; the rolled-back one leaves nothing at all.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))  # the sample's `app` package, as the mega command has it

from app.services.signups import SignupService, create_tables  # noqa: E402
from mega import load_config, outbox  # noqa: E402
from mega.runtime import boot, shutdown  # noqa: E402


async def main(action: str) -> None:
    config = load_config(ROOT / "mega_config.py", signs=False)  # signs nothing: no secret key
    ctx = await boot(config, role="script")
    try:
        if action != "stats":
            create_tables(ctx.db)  # the demo's own table (the web app makes it at start)
            service = SignupService(ctx.db)
            for email, mode in (("ada@example.com", "ok"), ("bob@example.com", "rollback")):
                result = await service.sign_up(email, mode)  # type: ignore[arg-type]
                print(f"{mode:8} {email}: committed={result.committed} event={result.event_id}")
        stats = await ctx.db.run(outbox.stats)
        print(f"outbox: pending={stats.pending} published={stats.published}")
    finally:
        await shutdown(ctx)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else "signups"))
