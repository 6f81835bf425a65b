"""What the consume loop says while a read beside its fetches fails, on the memory driver with
the failure injected: the outage once, then its end, never a line per fetch."""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest

from mega import Context, Job, JobRunner
from mega.drivers.base import DriverUnavailable
from mega.lanes import consumer
from mega.lanes.control import LaneControl
from mega.testing import memory_context
from tests.mega.jobs.test_contract import until

DONE: list[int] = []


class Counted(Job):
    bus = "jobs"
    subject = "counted"

    async def run(self, payload: int, ctx: Context) -> None:
        DONE.append(payload)


@asynccontextmanager
async def consuming(ctx: Context) -> AsyncIterator[None]:
    """A JobRunner consuming Counted in `ctx` for the block."""
    worker = JobRunner(ctx)
    worker.register(Counted)
    await worker.start()
    try:
        yield
    finally:
        await worker.stop(5)


@asynccontextmanager
async def logged(caplog: pytest.LogCaptureFixture) -> AsyncIterator[None]:
    """mega's INFO lines and above, captured for the block."""
    with caplog.at_level(logging.INFO, logger="mega"):
        yield


async def test_unreadable_cancels_are_said_once_and_their_return_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    ctx = memory_context()
    await Counted.cancel(ctx, "nothing")  # opens the cancel window: each fetch reads it
    outage = {"on": True}
    read, marks = LaneControl.refresh_cancels, LaneControl.cancelled

    async def refresh_cancels(self: LaneControl) -> None:
        if outage["on"]:
            raise DriverUnavailable("the records do not answer (planned)")
        await read(self)

    async def cancelled(self: LaneControl, job_ids: list[str]) -> Any:
        if outage["on"]:
            raise DriverUnavailable("the records do not answer (planned)")
        return await marks(self, job_ids)

    monkeypatch.setattr(LaneControl, "refresh_cancels", refresh_cancels)
    monkeypatch.setattr(LaneControl, "cancelled", cancelled)
    async with consuming(ctx), logged(caplog):
        for n in range(5):  # five fetches, each with its jobs started unread
            await Counted.enqueue(ctx, n)
            await until(lambda n=n: n in DONE, f"job {n} done")
        outage["on"] = False
        for n in (5, 6):  # a fetch may still use the window read in the outage: two
            await asyncio.sleep(0.1)  # past the window's freshness (50 ms): read anew
            await Counted.enqueue(ctx, n)
            await until(lambda n=n: n in DONE, f"job {n} done")
    said = [r.getMessage() for r in caplog.records if "its cancels" in r.getMessage()]
    assert said[0] == (
        "Counted: cannot read its cancels (the records do not answer (planned)): its jobs "
        "start unread until it can"
    )
    [back] = said[1:]  # five fetches in the outage, perhaps one more on a read made in it
    assert re.fullmatch(
        r"Counted: reads its cancels again \([56] fetch\(es\) started unread\)", back
    )


async def test_an_unreadable_pause_is_said_once_and_its_return_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    ctx = memory_context()
    monkeypatch.setattr(consumer, "WATCH_S", 0.01)  # the watch's reads, a hundred a second
    failed = {"reads": 0, "on": True}
    refresh = LaneControl.refresh

    async def unreadable(self: LaneControl) -> None:
        if failed["on"]:
            failed["reads"] += 1
            raise DriverUnavailable("the records do not answer (planned)")
        await refresh(self)

    monkeypatch.setattr(LaneControl, "refresh", unreadable)
    async with consuming(ctx), logged(caplog):
        await until(lambda: failed["reads"] >= 20, "twenty failed reads")
        failed["on"] = False
        await until(lambda: "again" in caplog.text, "the reads' return said")
    said = [r.getMessage() for r in caplog.records if "pause and cancels" in r.getMessage()]
    assert said[0] == (
        "Counted: cannot read its pause and cancels (the records do not answer (planned)): it "
        "keeps the last ones it read until it can"
    )
    [back] = said[1:]
    again = re.fullmatch(
        r"Counted: reads its pause and cancels again \((\d+) read\(s\) failed\)", back
    )
    assert again is not None and int(again[1]) >= 10, back  # many failed reads, one line
