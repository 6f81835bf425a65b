"""mega/lanes/timelimit.py: the lane's `timeout_s` as a middleware (the contract suite runs it
on every driver: tests/mega/jobs/test_contract.py)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from mega.drivers.base import Delivery
from mega.errors import JobTimeout
from mega.lanes.middleware import Run
from mega.lanes.timelimit import TimeLimited

LIMIT = TimeLimited(0.05)


def a_run() -> Run:
    return Run("Slow", "job", None, Delivery("j1", "s", b"null", 1, None, None, 1, None))


async def test_a_run_within_its_limit_returns_its_result() -> None:
    async def quick(run: Run) -> Any:
        return "done"

    assert await LIMIT(a_run(), quick) == "done"


async def test_a_run_past_its_limit_is_cancelled_and_fails_as_job_timeout() -> None:
    cancelled = asyncio.Event()

    async def hangs(run: Run) -> Any:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise

    with pytest.raises(JobTimeout, match=r"longer than its timeout_s \(0\.05 s\)"):
        await LIMIT(a_run(), hangs)
    assert cancelled.is_set()


async def test_a_run_that_swallows_the_cancel_is_cancelled_again() -> None:
    cancels = 0

    async def stubborn(run: Run) -> Any:
        nonlocal cancels
        while True:
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                cancels += 1
                if cancels > 1:
                    raise

    with pytest.raises(JobTimeout):
        await LIMIT(a_run(), stubborn)
    assert cancels == 2


async def test_the_runs_own_timeout_error_passes_through() -> None:
    async def own(run: Run) -> Any:
        raise TimeoutError("the API's")

    with pytest.raises(TimeoutError, match="the API's") as info:
        await LIMIT(a_run(), own)
    assert not isinstance(info.value, JobTimeout)
