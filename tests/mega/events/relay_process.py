"""A relay in a process of its own that dies by SIGKILL at a chosen point, for the relay fault
tests: `python -m tests.mega.events.relay_process <config> before_puback|after_puback`.

after_puback: every row of the batch was published and acknowledged by JetStream, and the
process dies before it marks them (the window the dedup id exists for). before_puback: it dies
with the rows taken and nothing published.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from typing import Any

from mega.config import load_config
from mega.runtime.bootstrap import boot
from mega.transactional import outbox_rows
from mega.transactional.relay import OutboxRelay


def die(*args: Any, **kwargs: Any) -> None:
    os.kill(os.getpid(), signal.SIGKILL)


async def main(config_path: str, when: str) -> None:
    config = load_config(config_path)
    ctx = await boot(config, role="relay", database=False)
    relay = OutboxRelay(ctx, jobs=config.jobs)
    if when == "after_puback":
        outbox_rows.mark_published = die  # type: ignore[assignment]
    else:
        relay._publish = die  # type: ignore[assignment,method-assign]
    await relay.relay_once()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
