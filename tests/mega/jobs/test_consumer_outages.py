"""What the consume loop says while a read beside its fetches fails, on the memory driver with
the failure injected: the outage once, then its end, never a line per fetch."""

from __future__ import annotations

import asyncio
import logging
import re
from typing import Any

import pytest

from mega import Context, Job, JobWorker
from mega.drivers.base import DriverUnavailable
from mega.jobs.control import LaneControl
from mega.testing import memory_context
from tests.mega.jobs.test_contract import until

DONE: list[int] = []


class Counted(Job):
    bus = "jobs"
    subject = "counted"

    async def run(self, payload: int, ctx: Context) -> None:
        DONE.append(payload)


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
    worker = JobWorker(ctx)
    worker.register(Counted)
    await worker.start()
    try:
        with caplog.at_level(logging.INFO, logger="mega"):
            for n in range(5):  # five fetches, each with its jobs started unread
                await Counted.enqueue(ctx, n)
                await until(lambda n=n: n in DONE, f"job {n} done")
            outage["on"] = False
            for n in (5, 6):  # a fetch may still use the window read in the outage: two
                await asyncio.sleep(0.1)  # past the window's freshness (50 ms): read anew
                await Counted.enqueue(ctx, n)
                await until(lambda n=n: n in DONE, f"job {n} done")
    finally:
        await worker.stop(5)
    said = [r.getMessage() for r in caplog.records if "its cancels" in r.getMessage()]
    assert said[0] == (
        "Counted: cannot read its cancels (the records do not answer (planned)): its jobs "
        "start unread until it can"
    )
    [back] = said[1:]  # five fetches in the outage, perhaps one more on a read made in it
    assert re.fullmatch(
        r"Counted: reads its cancels again \([56] fetch\(es\) started unread\)", back
    )
