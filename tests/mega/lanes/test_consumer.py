"""mega/lanes/consumer.py: what the loop starts when, against a receiver that hands out what a
test gives it (the contract suite proves the same on every driver: tests/mega/jobs/)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from mega import Context, Job, JobQueue, JobRunner
from mega.drivers.base import Delivery, DlqRecord
from mega.drivers.memory import receiver as memory_receiver
from mega.drivers.memory.receiver import MemoryReceiver
from mega.jobs.spec import validate_job
from mega.lanes.consumer import Consumer
from mega.lanes.control import LaneControl
from mega.lanes.executor import Executor
from mega.testing import memory_context
from tests.factories import until_cancelled


class Busy(Job):
    subject = "lanes.busy"
    bus = "jobs"
    concurrency = 2
    ack_wait_s = 30

    async def run(self, payload: Any, ctx: Any) -> None:
        return None


POLICY = validate_job(Busy, {"jobs"})


class Receiver:
    """Hands out its `waiting` deliveries, as many as a fetch asks; says how each was settled."""

    def __init__(self, deliveries: list[Delivery]) -> None:
        self.waiting = list(deliveries)
        self.settled: dict[str, str] = {}
        self.woken = asyncio.Event()

    async def fetch(self, limit: int) -> list[Delivery]:
        if not self.waiting:
            self.woken.clear()
            await self.woken.wait()  # a long poll, ended by `wake`
        taken, self.waiting = self.waiting[:limit], self.waiting[limit:]
        return taken

    def wake(self) -> None:
        self.woken.set()

    async def ack(self, delivery: Delivery) -> None:
        self.settled[delivery.id] = "ack"

    async def retry(self, delivery: Delivery, *, due_ms: int, attempts: int) -> None:
        self.settled[delivery.id] = "retry"

    async def release(self, delivery: Delivery, *, delay_s: float) -> None:
        self.settled[delivery.id] = "release"

    async def dead_letter(self, delivery: Delivery, record: DlqRecord, *, terminate: bool) -> None:
        self.settled[delivery.id] = f"dead_letter {record['error']['type']}"

    async def extend(self, delivery: Delivery) -> None:
        return None

    async def close(self) -> None:
        return None


def consumer_of(receiver: Receiver, run: Any) -> Consumer:
    """The consume loop of POLICY's lane over `receiver`, each delivery run by `run`."""
    return Consumer(Executor(receiver, POLICY, run, signal, instance_id="w1", group=None))


def delivery(job_id: str) -> Delivery:
    return Delivery(job_id, "lanes.busy", b"{}", 1, 1_000, None, job_id, None)


async def signal(name: str, **fields: Any) -> None:
    return None


async def until(check: Any, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.005)


async def test_no_more_than_concurrency_run_at_once_and_each_is_settled() -> None:
    running, most = 0, 0
    release = asyncio.Event()

    async def run(payload: Any, _delivery: Delivery) -> None:
        nonlocal running, most
        running += 1
        most = max(most, running)
        await release.wait()
        running -= 1

    receiver = Receiver([delivery(f"j{n}") for n in range(5)])
    loop = consumer_of(receiver, run)
    task = asyncio.create_task(loop.run())
    await until(lambda: running == 2)
    await asyncio.sleep(0.05)  # room for a third start, which must not come
    assert (running, len(receiver.waiting)) == (2, 3)
    release.set()
    await until(lambda: len(receiver.settled) == 5)
    loop.request_stop(1.0)
    await task
    assert most == 2 and set(receiver.settled.values()) == {"ack"}
    assert loop.settled == 5


async def test_a_delivery_whose_id_no_engine_could_key_is_refused_and_the_rest_run() -> None:
    ran: list[str] = []

    async def run(payload: Any, received: Delivery) -> None:
        ran.append(received.id)

    bad = delivery("x" * 5_000)
    receiver = Receiver([delivery("ok-1"), bad, delivery("ok-2")])
    loop = consumer_of(receiver, run)
    task = asyncio.create_task(loop.run())
    await until(lambda: len(receiver.settled) == 3)
    loop.request_stop(1.0)
    await task
    assert sorted(ran) == ["ok-1", "ok-2"]
    refused = [how for job_id, how in receiver.settled.items() if job_id.startswith("invalid-id-")]
    assert refused == ["dead_letter InvalidId"]


async def test_a_stop_lets_runs_finish_within_the_drain_and_hands_back_the_rest() -> None:
    async def run(payload: Any, received: Delivery) -> None:
        if received.id == "quick":
            await asyncio.sleep(0.01)
        else:
            await until_cancelled()  # stuck: the drain ends it

    receiver = Receiver([delivery("quick"), delivery("stuck")])
    loop = consumer_of(receiver, run)
    task = asyncio.create_task(loop.run())
    await until(lambda: len(loop.running) == 2)
    loop.request_stop(0.3)
    await task
    assert receiver.settled == {"quick": "ack", "stuck": "release"}
    assert loop.closed.is_set()


class Counted(Job):
    bus = "jobs"
    subject = "lanes.counted"

    async def run(self, payload: int, ctx: Context) -> None:
        COUNTED.append(payload)


COUNTED: list[int] = []


async def test_an_idle_lane_reads_its_cancels_only_when_jobs_come_and_still_skips_a_cancelled_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A read of the cancel window beside a fetch that comes back empty would be stale when
    jobs come: an idle lane makes none, and reads the window once a fetch brings jobs."""
    monkeypatch.setattr(memory_receiver, "FETCH_WAIT_S", 0.01)  # idle fetches, a hundred a second
    reads, fetches = [0], [0]
    refresh_cancels, fetch = LaneControl.refresh_cancels, MemoryReceiver.fetch

    async def counted_read(self: LaneControl) -> None:
        reads[0] += 1
        await refresh_cancels(self)

    async def counted_fetch(self: MemoryReceiver, limit: int) -> list[Delivery]:
        fetches[0] += 1
        return await fetch(self, limit)

    monkeypatch.setattr(LaneControl, "refresh_cancels", counted_read)
    monkeypatch.setattr(MemoryReceiver, "fetch", counted_fetch)
    ctx = memory_context()
    await Counted.cancel(ctx, "nothing")  # opens the lane's cancel window: reads matter
    runner = JobRunner(ctx)
    runner.register(Counted)
    await runner.start()
    try:
        await until(lambda: fetches[0] >= 30)  # the lane idle: thirty empty fetches
        assert reads[0] == 1  # beside the first fetch only, made before it knew it was idle
        cancelled = await Counted.enqueue(ctx, 1, delay=0.2)  # comes to the idle lane...
        assert (await Counted.cancel(ctx, cancelled)).state == "cancelled"  # ...cancelled
        await Counted.enqueue(ctx, 2, delay=0.2)
        await until(lambda: COUNTED == [2])
        assert reads[0] >= 2  # read once jobs came
        status = await JobQueue(ctx, Counted.bus).status(Counted, cancelled)
        assert status is not None and status.state == "cancelled"
    finally:
        await runner.stop(5)
    assert COUNTED == [2]  # the cancelled one never ran
