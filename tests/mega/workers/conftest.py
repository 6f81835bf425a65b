"""Pools of real child processes (and real threads) for the workers' tests."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from mega.workers.pool import WorkerPool
from mega.workers.worker import Worker

ROOT = Path(__file__).resolve().parents[3]
TASK_FILE = "tests/mega/workers/worker_tasks.py"

MakePool = Callable[..., Awaitable[WorkerPool]]


def declare(**attrs: Any) -> type[Worker]:
    attrs.setdefault("task_file", TASK_FILE)
    attrs.setdefault("pool_size", 1)
    return type("TestWorker", (Worker,), attrs)


@pytest.fixture
async def make_pool() -> AsyncIterator[MakePool]:
    """Start a pool from Worker attributes; every pool is stopped at teardown."""
    pools: list[WorkerPool] = []

    async def make(**attrs: Any) -> WorkerPool:
        pool = WorkerPool(declare(**attrs), root=ROOT)
        pools.append(pool)
        await pool.start()
        return pool

    yield make
    for pool in pools:
        await pool.stop(timeout_s=1)
