"""progress() inside pool tasks, in process and thread mode, against real children and threads."""

from __future__ import annotations

import asyncio
import functools
import math
from collections.abc import Callable
from typing import Any

import pytest

import mega
from mega.errors import TaskFailed
from mega.workers import progress
from mega.workers.pool import WorkerPool
from mega.workers.task_progress import PROGRESS_INTERVAL_S, ProgressReporter
from tests.mega.workers.conftest import MakePool

MODES = ["process", "thread"]


@pytest.fixture
def make_pool(make_pool: MakePool) -> MakePool:
    """The shared pool maker, with the tasks that report progress."""
    return functools.partial(
        make_pool, name="ProgressWorker", task_file="tests/mega/workers/progress_tasks.py"
    )


class Seen:
    """An on_progress callback that keeps what it was given."""

    def __init__(self) -> None:
        self.calls: list[tuple[float, str | None]] = []

    def __call__(self, fraction: float, note: str | None) -> None:
        self.calls.append((fraction, note))

    @property
    def fractions(self) -> list[float]:
        return [fraction for fraction, _ in self.calls]


# -- the throttle, on a fake clock ---------------------------------------------------------------


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    fake = FakeClock()
    monkeypatch.setattr("mega.workers.task_progress.time.monotonic", fake)
    return fake


def test_reporter_sends_the_first_holds_the_rest_of_the_interval_and_flushes_the_last(
    clock: FakeClock,
) -> None:
    sent: list[tuple[float, str | None]] = []
    reporter = ProgressReporter(lambda fraction, note: sent.append((fraction, note)))
    assert reporter.used is False
    reporter.report(0.1, "a")
    reporter.report(0.2, "b")
    reporter.report(0.3, "c")
    assert sent == [(0.1, "a")] and reporter.used is True
    clock.now += PROGRESS_INTERVAL_S
    reporter.report(0.4, None)
    assert sent == [(0.1, "a"), (0.4, None)]  # the held 0.3 was superseded
    reporter.report(0.5, "e")
    reporter.finish()
    assert sent == [(0.1, "a"), (0.4, None), (0.5, "e")]
    assert reporter.used is False
    reporter.finish()  # nothing held: nothing sent
    reporter.report(0.0, "next task")  # finish() reset the interval: sent at once
    assert sent[-1] == (0.0, "next task")


def test_outside_a_pool_task_progress_does_nothing() -> None:
    # Seen as returning `object`: mypy refuses to read what a `-> None` function returns.
    call: Callable[..., object] = progress
    assert call(0.5) is None
    assert call(1, "all done") is None
    assert mega.progress is progress


@pytest.mark.parametrize("fraction", [-0.01, 1.0001, math.nan, math.inf, "0.5", None, True])
def test_a_bad_fraction_is_a_value_error(fraction: Any) -> None:
    with pytest.raises(ValueError, match="fraction must be a number from 0 to 1"):
        progress(fraction)


def test_a_note_that_is_not_a_string_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="note must be text"):
        progress(0.5, 42)  # type: ignore[arg-type]


# -- in a pool -----------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
async def test_the_caller_sees_increasing_fractions_up_to_the_last_and_the_result_unchanged(
    make_pool: MakePool, mode: str
) -> None:
    pool = await make_pool(mode=mode)
    seen = Seen()
    result = await pool.run("count_up", {"steps": 5, "sleep_ms": 60}, on_progress=seen)
    assert result == {"steps": 5}
    assert seen.fractions == sorted(seen.fractions) and len(seen.calls) >= 2
    assert seen.calls[-1] == (1.0, "5 of 5")  # the last report arrives before the result
    assert all(0 < fraction <= 1 for fraction in seen.fractions)


async def test_a_child_sends_no_progress_frames_to_a_caller_that_does_not_listen(
    make_pool: MakePool, monkeypatch: pytest.MonkeyPatch
) -> None:
    frames: list[Any] = []
    original = WorkerPool._child_progress

    def counting(self: WorkerPool, *args: Any) -> None:
        frames.append(args)
        original(self, *args)

    monkeypatch.setattr(WorkerPool, "_child_progress", counting)
    pool = await make_pool(mode="process")
    assert await pool.run("count_up", {"steps": 3, "sleep_ms": 60}) == {"steps": 3}
    assert frames == []  # the web's event loop is not woken for reports nobody reads
    await pool.run("count_up", {"steps": 3, "sleep_ms": 60}, on_progress=Seen())
    assert len(frames) >= 2  # the same child reports to a caller that listens


@pytest.mark.parametrize("mode", MODES)
async def test_a_tight_loop_is_throttled_and_its_last_report_still_arrives(
    make_pool: MakePool, mode: str
) -> None:
    pool = await make_pool(mode=mode)
    seen = Seen()
    loop = asyncio.get_running_loop()
    started = loop.time()
    assert await pool.run("tight", 300_000, on_progress=seen) == 300_000
    elapsed_s = loop.time() - started
    assert seen.calls[-1] == (1.0, "done")
    assert len(seen.calls) <= elapsed_s / PROGRESS_INTERVAL_S + 2, "one report per interval"
    assert seen.fractions == sorted(seen.fractions)


@pytest.mark.parametrize("mode", MODES)
async def test_a_bad_fraction_in_a_task_fails_the_task_with_value_error(
    make_pool: MakePool, mode: str
) -> None:
    pool = await make_pool(mode=mode)
    with pytest.raises(TaskFailed) as caught:
        await pool.run("bad_fraction", 2.0, on_progress=Seen())
    assert caught.value.exc_type == "ValueError"
    assert "fraction must be a number from 0 to 1" in caught.value.message
    assert await pool.run("silent", "next") == "next"  # the slot lives on


@pytest.mark.parametrize("mode", MODES)
async def test_reports_without_a_callback_and_a_failing_callback_change_nothing(
    make_pool: MakePool, mode: str, caplog: pytest.LogCaptureFixture
) -> None:
    pool = await make_pool(mode=mode)
    assert await pool.run("count_up", {"steps": 3, "sleep_ms": 1}) == {"steps": 3}

    def broken(fraction: float, note: str | None) -> None:
        raise RuntimeError("callback bug")

    assert await pool.run("count_up", {"steps": 3, "sleep_ms": 1}, on_progress=broken) == {
        "steps": 3
    }
    assert "on_progress of ProgressWorker.count_up raised" in caplog.text
    # The next task on the same slot starts with a fresh interval: its first report goes out.
    seen = Seen()
    assert await pool.run("count_up", {"steps": 1, "sleep_ms": 0}, on_progress=seen) == {"steps": 1}
    assert seen.calls == [(1.0, "1 of 1")]
