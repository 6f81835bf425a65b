"""What an enqueue says when its bus fails, on the memory driver with the failure injected: a
job that was not stored is never logged as stored."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from mega import Context, Job, JobQueue
from mega.drivers.base import DriverUnavailable
from mega.errors import DependencyUnavailable
from mega.testing import memory_context


class Noted(Job):
    bus = "jobs"
    subject = "noted"

    async def run(self, payload: Any, ctx: Context) -> None:
        return None


async def down(*_: Any, **__: Any) -> Any:
    raise DriverUnavailable("the bus is away")


@pytest.fixture
async def queue() -> JobQueue:
    made = JobQueue(memory_context(), "jobs")
    await made.ensure(Noted)
    return made


async def test_a_failed_enqueue_is_one_error_and_no_stored_line(
    queue: JobQueue, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(queue.bus, "publish", down)
    monkeypatch.setattr(queue.bus, "put_records", down)
    with caplog.at_level(logging.WARNING), pytest.raises(DependencyUnavailable):
        await queue.enqueue(Noted, {})
    with caplog.at_level(logging.WARNING), pytest.raises(DependencyUnavailable):
        await queue.enqueue_many(Noted, [{}, {}])
    assert "stored" not in caplog.text  # nothing was


async def test_jobs_stored_without_their_records_say_so_once(
    queue: JobQueue, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(queue.bus, "put_records", down)
    with caplog.at_level(logging.WARNING):
        await queue.enqueue_many(Noted, [{}, {}])
    [line] = [r.getMessage() for r in caplog.records]
    assert line == "Noted: 2 job(s) stored, their status records not (the bus is away)"
    assert (await queue.stats(Noted)).pending == 2
