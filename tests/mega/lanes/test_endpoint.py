"""A lane endpoint (mega/lanes/endpoint.py): what the job queue and the event bus of one bus alias
share. Here: its lanes are set up once, however many calls ask at once."""

from __future__ import annotations

import asyncio
from typing import Any

from mega import Job, JobQueue
from mega.drivers.base import DriverUnavailable, Lane
from mega.errors import DependencyUnavailable
from mega.testing import memory_context


class Mail(Job):
    subject = "endpoint.mail"
    bus = "jobs"

    async def run(self, payload: Any, ctx: Any) -> None:
        return None


def counting_ensures(queue: JobQueue, fail_first: int = 0) -> list[str]:
    """The lane names the bus is asked to set up, in order; the first `fail_first` calls fail as
    a bus that does not answer."""
    calls: list[str] = []
    ensure = queue.bus.ensure

    async def counted(lane: Lane, *, apply_limits: bool) -> None:
        calls.append(lane.name)
        await asyncio.sleep(0.01)  # a round trip, during which the other calls come
        if len(calls) <= fail_first:
            raise DriverUnavailable("down")
        await ensure(lane, apply_limits=apply_limits)

    queue.bus.ensure = counted  # type: ignore[method-assign]
    return calls


async def test_many_first_enqueues_at_once_set_the_lane_up_once() -> None:
    queue = JobQueue(memory_context("jobs"), "jobs")
    calls = counting_ensures(queue)
    ids = await asyncio.gather(*(queue.enqueue(Mail, {"n": n}) for n in range(200)))
    assert len(set(ids)) == 200
    assert calls == ["Mail"]
    assert (await queue.stats(Mail)).pending == 200
    await queue.ensure(Mail, force=True)  # force asks the bus again
    assert calls == ["Mail", "Mail"]


async def test_a_set_up_that_fails_is_tried_again_by_the_next_call() -> None:
    queue = JobQueue(memory_context("jobs"), "jobs")
    calls = counting_ensures(queue, fail_first=1)
    results = await asyncio.gather(
        *(queue.enqueue(Mail, {"n": n}) for n in range(3)), return_exceptions=True
    )
    failed = [r for r in results if isinstance(r, DependencyUnavailable)]
    assert len(failed) == 1 and "cannot set up its queue" in str(failed[0])
    assert calls == ["Mail", "Mail"]  # the first failed; the next waiting call made it
