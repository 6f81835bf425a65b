"""PostgreSQL as a job queue: a bare psycopg claim loop, pgqueuer and procrastinate, and mega's
postgres bus driver held to them, all on one fresh database of a private server.

    .venv/bin/python -m bench.bench_postgres [--jobs 20000] [--procrastinate-jobs 2000] [--durable]

The server: `EmbeddedPostgres(fast=True)` by default, the embedded server's setting for data
that may be lost (like the Redis of bench_drivers.py, which keeps nothing on disk); `--durable`
for its default settings. Every job is checked to have run exactly once, and every queue to be
empty afterwards (nothing would run again).

1. Baseline, in this process: N rows COPYed into a table (untimed), then one psycopg 3 async
   connection in autocommit, in a loop: claim 100 rows, `UPDATE ... SET status = 'running'
   WHERE id IN (SELECT id ... WHERE status = 'queued' ORDER BY id FOR UPDATE SKIP LOCKED
   LIMIT 100) RETURNING id, payload`, "run" them (count each payload), then delete them in one
   `DELETE ... WHERE id = ANY(...)`: two statements, two commits, per 100 jobs.
2. mega's postgres driver: N jobs enqueued with `enqueue_many` (untimed), then one consume
   loop (concurrency 200) timed until every one has run. Targets: >= 0.5x the bare loop,
   >= 1x pgqueuer, >= 10x procrastinate.
3. Peers, each in the peers' own virtualenv (a script of bench/peers/, see there): pgqueuer, N
   jobs enqueued in one batch insert, then one QueueManager on asyncpg with a batch size of 100
   (no cap on the jobs in flight, its default); procrastinate on psycopg, a smaller N (it runs
   a few hundred jobs/s: `--procrastinate-jobs`, 2,000 by default) deferred in batches of
   1,000, then one worker with its defaults (concurrency 1). Each is timed from its worker's
   start until every job has run.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run by path (python bench/x.py): make `bench` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.peers import run_peer
from bench.report import Result, Row, print_table, result, row

BATCH = 100
BARE_TARGET = 0.5  # mega's postgres driver >= this x the bare claim loop
PGQUEUER_TARGET = 1.0
PROCRASTINATE_TARGET = 10.0


async def bare_rate(url: str, jobs: int) -> float:
    """The bare claim loop of step 1: jobs/s, every row run exactly once and the table empty."""
    import psycopg

    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        await conn.execute(
            "CREATE TABLE bench_bare (id bigserial PRIMARY KEY, payload int NOT NULL, "
            "status text NOT NULL DEFAULT 'queued', claimed_at timestamptz)"
        )
        async with conn.cursor() as cur, cur.copy("COPY bench_bare (payload) FROM STDIN") as copy:
            for n in range(jobs):
                await copy.write_row((n,))
        await conn.execute("VACUUM ANALYZE bench_bare")
        seen: Counter[int] = Counter()
        started = time.perf_counter()
        while True:
            claimed = await (
                await conn.execute(
                    "UPDATE bench_bare SET status = 'running', claimed_at = now() "
                    "WHERE id IN (SELECT id FROM bench_bare WHERE status = 'queued' "
                    "ORDER BY id FOR UPDATE SKIP LOCKED LIMIT %s) RETURNING id, payload",
                    (BATCH,),
                )
            ).fetchall()
            if not claimed:
                break
            for _, payload in claimed:
                seen[payload] += 1  # the no-op job
            await conn.execute(
                "DELETE FROM bench_bare WHERE id = ANY(%s)", ([id_ for id_, _ in claimed],)
            )
        elapsed = time.perf_counter() - started
        left = (await (await conn.execute("SELECT count(*) FROM bench_bare")).fetchone() or [-1])[0]
        await conn.execute("DROP TABLE bench_bare")
    assert set(seen.values()) == {1} and sorted(seen) == list(range(jobs)), "not exactly once"
    assert left == 0, f"bare loop: {left} rows left"
    return jobs / elapsed


async def mega_postgres_rate(url: str, jobs: int) -> float:
    """mega's postgres bus driver on the same database: `jobs` no-op jobs enqueued (untimed),
    then one consume loop (concurrency 200) timed until every one has run exactly once; jobs/s."""
    from bench.bench_drivers import _drain, driver_context

    ctx = await driver_context("postgres", url)
    try:
        return await _drain(ctx, jobs)
    finally:
        await ctx.bus("jobs").close()


async def peer_rate(script: str, url: str, jobs: int) -> float:
    """A peer's jobs/s (bench/peers/<script>, in the peers' virtualenv), checked exactly once."""
    answer = await run_peer(script, url, str(jobs))
    name = script.removesuffix("_drain.py")
    assert answer["ran"] == jobs, f"{name}: {answer['ran']} of {jobs} jobs ran"
    assert answer["exactly_once"], f"{name}: not exactly once ({answer['left']} rows left)"
    return float(answer["jobs_per_s"])


async def _bench(jobs: int, procrastinate_jobs: int, durable: bool) -> Result:
    from mega.drivers.postgres.embedded import EmbeddedPostgres

    notes = [
        "every job checked to have run exactly once, and every queue empty afterwards",
        f"procrastinate on {procrastinate_jobs:,} jobs, the others on {jobs:,}",
    ]
    with tempfile.TemporaryDirectory(prefix="bench-postgres-") as tmp:
        server = EmbeddedPostgres(Path(tmp) / "postgres", fast=not durable).start()
        try:
            bare = await bare_rate(server.url, jobs)
            mega = await mega_postgres_rate(server.url, jobs)
            pgqueuer = await peer_rate("pgqueuer_drain.py", server.url, jobs)
            procrastinate = await peer_rate(
                "procrastinate_drain.py", server.url, procrastinate_jobs
            )
        finally:
            server.stop()

    rows: list[Row] = [
        row(f"bare psycopg claim loop, batches of {BATCH} (jobs/s)", bare),
        row(f"pgqueuer, one worker, batch size {BATCH} (jobs/s)", pgqueuer),
        row("procrastinate, one worker, concurrency 1 (jobs/s)", procrastinate),
    ]
    rows += [
        row(
            "postgres driver (jobs/s)",
            mega,
            baseline=bare,
            baseline_name="bare loop",
            target=f">= {BARE_TARGET}x",
            passed=mega / bare >= BARE_TARGET,
        ),
        row(
            "postgres driver against pgqueuer (jobs/s)",
            mega,
            baseline=pgqueuer,
            baseline_name="pgqueuer",
            target=f">= {PGQUEUER_TARGET}x",
            passed=mega / pgqueuer >= PGQUEUER_TARGET,
        ),
        row(
            "postgres driver against procrastinate (jobs/s)",
            mega,
            baseline=procrastinate,
            baseline_name="procrastinate",
            target=f">= {PROCRASTINATE_TARGET:.0f}x",
            passed=mega / procrastinate >= PROCRASTINATE_TARGET,
        ),
    ]
    server_kind = "default settings" if durable else "fast=True (commits not flushed to disk)"
    res = result(
        "postgres",
        "PostgreSQL job queues: a bare claim loop, pgqueuer, procrastinate, mega's driver",
        f"{jobs:,} no-op jobs per run ({procrastinate_jobs:,} for procrastinate); one fresh "
        f"database on a private PostgreSQL, {server_kind}",
        rows,
        notes=notes,
        data={
            "jobs": jobs,
            "procrastinate_jobs": procrastinate_jobs,
            "durable": durable,
            "bare_per_s": bare,
            "mega_postgres_per_s": mega,
            "pgqueuer_per_s": pgqueuer,
            "procrastinate_per_s": procrastinate,
        },
    )
    print_table(res)
    return res


def run(jobs: int = 20_000, procrastinate_jobs: int = 2_000, durable: bool = False) -> Result:
    return asyncio.run(_bench(jobs, procrastinate_jobs, durable))


def _main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--procrastinate-jobs", type=int, default=2_000)
    parser.add_argument("--durable", action="store_true", help="the server's default settings")
    args: Any = parser.parse_args()
    return 0 if run(args.jobs, args.procrastinate_jobs, args.durable)["passed"] else 1


if __name__ == "__main__":
    sys.exit(_main())
