"""The `hash` pool's task: the function alone, then through a real pool (and a killed child)."""

from __future__ import annotations

import asyncio
import hashlib

import pytest

from app.workers.hash_tasks import MAX_ROUNDS, sha256_loop
from app.workers.hash_worker import HashWorker
from mega.errors import WorkerError
from mega.testing import kill_child, memory_context, worker_pool

ONCE = hashlib.sha256(b"mega").hexdigest()
TWICE = hashlib.sha256(ONCE.encode()).hexdigest()  # round 2 hashes round 1's hex digest


def test_sha256_loop_rehashes_the_hex_digest_rounds_times() -> None:
    assert sha256_loop({"input": "mega", "rounds": 1}) == {"digest": ONCE, "rounds": 1}
    assert sha256_loop({"input": "mega", "rounds": 2}) == {"digest": TWICE, "rounds": 2}


@pytest.mark.parametrize("rounds", [0, True, MAX_ROUNDS + 1, "9"])
def test_sha256_loop_refuses_bad_rounds(rounds: object) -> None:
    with pytest.raises(ValueError, match="rounds must be an int"):
        sha256_loop({"input": "mega", "rounds": rounds})


async def test_the_pool_runs_it_and_survives_a_killed_child() -> None:
    ctx = memory_context()
    async with worker_pool(HashWorker, ctx) as pool:  # one real child process
        two = {"input": "mega", "rounds": 2}
        assert (await ctx.workers["hash"].run("sha256_loop", two))["digest"] == TWICE
        long = asyncio.create_task(pool.run("sha256_loop", {"rounds": MAX_ROUNDS}))
        async with asyncio.timeout(5):
            while pool.stats()["busy"] == 0:  # dispatched to the child
                await asyncio.sleep(0.001)
        kill_child(pool)
        with pytest.raises(WorkerError) as crashed:
            await long
        assert crashed.value.code == "worker.crashed"
        assert (await pool.run("sha256_loop", two))["digest"] == TWICE  # on the replacement
        assert pool.stats()["restarts"] == 1
