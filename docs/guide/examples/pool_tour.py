"""The CPU pool from a terminal: what /demo/worker shows, in one script.

    .venv/bin/python docs/guide/examples/pool_tour.py

Starts the sample's `hash` pool (app/workers/hash_worker.py: two processes) without a web app,
then: a hash with progress reports, a timeout that kills the task's process, a burst that
overflows the wait queue, an argument that cannot be pickled, and a child killed on purpose.
Every failure is a WorkerError with a stable code (the web app turns each into an HTTP status).
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))  # the sample's `app` package, as the mega command has it

from app.workers.hash_worker import HashWorker  # noqa: E402
from mega import WorkerPool  # noqa: E402
from mega.errors import WorkerError  # noqa: E402


async def main() -> None:
    pool = WorkerPool(HashWorker, root=ROOT)
    await pool.start()
    try:
        reports: list[float] = []
        result = await pool.run(
            "sha256_loop", {"input": "mega", "rounds": 300_000},
            on_progress=lambda fraction, note: reports.append(fraction),
        )  # fmt: skip
        print(f"digest {result['digest'][:16]}... after {len(reports)} progress report(s)")

        # Both slots idle: two run at once, max_queue wait, and one call more is refused at once.
        burst = [{"rounds": 200_000}] * (pool.settings.pool_size + pool.settings.max_queue + 1)
        outcomes = await asyncio.gather(
            *(pool.run("sha256_loop", task) for task in burst), return_exceptions=True
        )
        refused = [o for o in outcomes if isinstance(o, WorkerError)]
        print(f"burst of {len(burst)}: {len(burst) - len(refused)} ran, "
              f"{len(refused)} refused ({refused[0].code if refused else '-'})")  # fmt: skip

        try:  # arguments cross a pipe as pickles: a lambda cannot
            await pool.run("sha256_loop", {"input": lambda: "x"})
        except WorkerError as exc:
            print(f"{exc.code}: {exc}")

        try:  # a timeout kills the child running it; a fresh one takes its place
            await pool.run("sha256_loop", {"rounds": 20_000_000}, timeout_ms=200)
        except WorkerError as exc:
            print(f"{exc.code}: {exc}")

        pid = pool.kill_one()  # SIGKILL, as an OOM kill would: the pool starts a replacement
        while pool.stats()["restarts"] < 1:
            await asyncio.sleep(0.05)
        print(f"killed child {pid}; restarts: {pool.stats()['restarts']}")
    finally:
        await pool.stop()


if __name__ == "__main__":
    asyncio.run(main())
