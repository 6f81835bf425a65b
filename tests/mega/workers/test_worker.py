"""Worker and WorkerPool against real child processes (and real threads): no fakes."""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from mega.errors import RegistrationError, TaskFailed, WorkerError, WorkerOverloaded
from mega.workers.child import CHILD_NICENESS
from mega.workers.pool import WorkerPool
from mega.workers.worker import Worker
from tests.mega.workers import worker_tasks
from tests.mega.workers.conftest import ROOT, TASK_FILE, MakePool, declare

TASKS = {
    "add",
    "block",
    "boom",
    "double",
    "echo",
    "exit_now",
    "noisy",
    "pid",
    "sleep_ms",
    "touch",
    "unpicklable_result",
    "weigh",
}


async def until(condition: Callable[[], bool]) -> None:
    """Wait for a state change the test caused; the limit only stops a broken test hanging."""
    async with asyncio.timeout(5):
        while not condition():
            await asyncio.sleep(0.002)


async def code_of(call: Awaitable[Any]) -> str:
    with pytest.raises(WorkerError) as caught:
        await call
    return caught.value.code


# -- declaration -------------------------------------------------------------------------------


def test_validate_resolves_defaults() -> None:
    class HashWorker(Worker):
        task_file = TASK_FILE

    settings = HashWorker.validate(ROOT)
    expected_size = max(1, (os.cpu_count() or 1) - 1)
    assert (settings.name, settings.module, settings.mode) == (
        "HashWorker",
        "tests.mega.workers.worker_tasks",
        "process",
    )
    assert (settings.pool_size, settings.max_restarts, settings.max_queue) == (
        expected_size,
        5,
        4 * expected_size,
    )
    assert settings.task_names == TASKS
    dotted = declare(name="hash", task_file="tests.mega.workers.worker_tasks").validate(ROOT)
    assert (dotted.name, dotted.module, dotted.pool_size) == (
        "hash",
        "tests.mega.workers.worker_tasks",
        1,
    )


@pytest.mark.parametrize(
    ("attrs", "field"),
    [
        ({"mode": "fiber"}, "mode"),
        ({"pool_size": 0}, "pool_size"),
        ({"pool_size": True}, "pool_size"),
        ({"max_restarts": -1}, "max_restarts"),
        ({"max_queue": "8"}, "max_queue"),
        ({"task_file": ""}, "task_file"),
        ({"task_file": "tests/mega/nope.py"}, "task_file"),
        ({"task_file": "tests.mega.nope"}, "task_file"),
        ({"task_file": "tests/mega/../../../etc/passwd.py"}, "task_file"),
        ({"task_file": "tests"}, "task_file"),  # imports, but defines no task
    ],
)
def test_validate_names_the_bad_field(attrs: dict[str, Any], field: str) -> None:
    with pytest.raises(RegistrationError, match=f"TestWorker.{field}: "):
        declare(**attrs).validate(ROOT)


def test_validate_reports_every_bad_field_at_once() -> None:
    with pytest.raises(RegistrationError) as caught:
        declare(mode="fiber", pool_size=True, max_queue=-1).validate(ROOT)
    assert caught.value.message == (
        "TestWorker.mode: must be one of ('process', 'thread'), got 'fiber'; "
        "TestWorker.pool_size: must be a positive int, got True; "
        "TestWorker.max_queue: must be an int >= 0, got -1"
    )


# -- process mode ------------------------------------------------------------------------------


async def test_returns_the_value_unchanged(make_pool: MakePool) -> None:
    pool = await make_pool(pool_size=2)
    value = {"n": [1, 2.5, None], "t": (1, "a"), "b": b"\x00\xff", "s": {3}}
    assert await pool.run("echo", value) == value
    assert await pool.run("add", {"a": 2, "b": 3}) == 5
    assert await pool.run("double", 21) == 42
    assert pool.stats() == {"busy": 0, "queued": 0, "size": 2, "restarts": 0, "broken": False}


async def test_task_prints_go_to_stderr_not_the_protocol_pipe(
    make_pool: MakePool, capfd: pytest.CaptureFixture[str]
) -> None:
    pool = await make_pool()
    assert await pool.run("noisy", [1, 2]) == [1, 2]
    assert await pool.run("echo", "after") == "after"
    assert "noise from a task" in capfd.readouterr().err


async def test_queued_tasks_run_fifo_when_all_workers_are_busy(
    make_pool: MakePool, tmp_path: Path
) -> None:
    pool = await make_pool(max_queue=10)
    dispatched: list[int] = []
    pool.on("dispatch", lambda event: dispatched.append(event["task_id"]))
    finished: list[object] = []

    async def run(task: str, args: object) -> None:
        finished.append(await pool.run(task, args))

    release = tmp_path / "release"
    first = asyncio.create_task(run("block", str(release)))
    await until(lambda: pool.stats()["busy"] == 1)
    rest = [asyncio.create_task(run("echo", n)) for n in range(5)]
    await until(lambda: pool.stats()["queued"] == 5)
    release.touch()
    await asyncio.gather(first, *rest)
    assert finished == [str(release), 0, 1, 2, 3, 4]
    await pool.stop()
    assert dispatched == sorted(dispatched)
    assert len(dispatched) == 6


@pytest.mark.parametrize("args", [lambda: 1, socket.socket], ids=["lambda", "socket"])
async def test_unpicklable_args_fail_at_dispatch(make_pool: MakePool, args: Any) -> None:
    pool = await make_pool()
    value = args() if args is socket.socket else args
    try:
        assert await code_of(pool.run("echo", value)) == "worker.invalid_args"
    finally:
        if isinstance(value, socket.socket):
            value.close()
    assert pool.stats()["busy"] == 0
    assert await pool.run("echo", "still fine") == "still fine"


class _FailsToUnpickle:
    """Pickles fine here; unpickling calls int("not a number") in the child, which raises."""

    def __reduce__(self) -> tuple[Any, ...]:
        return (int, ("not a number",))


async def test_args_the_child_cannot_unpickle_are_invalid_args(make_pool: MakePool) -> None:
    pool = await make_pool()
    with pytest.raises(WorkerError, match="cannot be unpickled in the child") as caught:
        await pool.run("echo", _FailsToUnpickle())
    assert caught.value.code == "worker.invalid_args"
    assert await pool.run("echo", "child survived") == "child survived"
    assert pool.stats()["restarts"] == 0


async def test_a_child_that_cannot_import_fails_start(tmp_path: Path) -> None:
    module = f"child_only_failure_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{module}.py").write_text(
        "import sys\n"
        "if sys.argv[0].endswith('workers/child.py'):\n"
        "    raise ImportError('only a worker child fails to import me')\n"
        "def echo(args):\n"
        "    return args\n"
    )
    pool = WorkerPool(declare(task_file=f"{module}.py", pool_size=2), root=tmp_path)
    with pytest.raises(WorkerError, match="failed to start") as caught:
        await pool.start()
    assert caught.value.code == "worker.crashed"
    assert pool.stats()["size"] == 0
    assert await code_of(pool.run("echo", 1)) == "worker.stopped"


async def test_run_before_start_is_refused() -> None:
    pool = WorkerPool(declare(), root=ROOT)
    with pytest.raises(WorkerError, match="pool TestWorker is not started") as caught:
        await pool.run("echo", 1)
    assert caught.value.code == "worker.stopped"


@pytest.mark.parametrize("mode", ["process", "thread"])
async def test_a_task_called_as_itself_gets_its_arguments_and_its_type(
    make_pool: MakePool, mode: str
) -> None:
    pool = await make_pool(mode=mode)
    cost: dict[str, int] = await pool.run(worker_tasks.weigh, "box", 3, express=True)
    doubled: int = await pool.run(worker_tasks.double, 21)  # an async def task: its result
    assert (cost, doubled) == ({"cost": 18}, 42)
    assert await pool.run("double", 21) == 42  # by name, as before: one `args`


async def test_a_function_that_is_not_the_pools_task_is_refused(make_pool: MakePool) -> None:
    pool = await make_pool()
    strangers: list[Callable[[], Any]] = [os.getpid, os.getcwd]
    for stranger in strangers:
        with pytest.raises(WorkerError, match=r"runs the tasks of tests\.mega\.workers") as caught:
            await pool.run(stranger)
        assert caught.value.code == "worker.unknown_task"


async def test_unknown_task_lists_the_tasks(make_pool: MakePool) -> None:
    pool = await make_pool()
    for name in ("nope", "_helper", "exists"):
        with pytest.raises(WorkerError, match="has no task") as caught:
            await pool.run(name, None)
        assert caught.value.code == "worker.unknown_task"
        assert "echo" in caught.value.message


async def test_task_exception_is_reraised_with_its_type_and_message(make_pool: MakePool) -> None:
    pool = await make_pool()
    with pytest.raises(TaskFailed) as caught:
        await pool.run("boom", None)
    assert (caught.value.code, caught.value.exc_type) == ("worker.task_failed", "ValueError")
    assert caught.value.message.endswith("raised ValueError: bad")
    with pytest.raises(TaskFailed, match="cannot be pickled") as unpicklable:
        await pool.run("unpicklable_result", None)
    assert unpicklable.value.code == "worker.task_failed"
    assert await pool.run("echo", 1) == 1


async def test_a_child_runs_niced_and_shares_the_cores_with_every_other_process(
    make_pool: MakePool,
) -> None:
    """Below the web process (niced CHILD_NICENESS), yet in the normal class: an idle-class
    child would run only on a core no other process wants, and starve beside a busy one."""
    pool = await make_pool()
    child = await pool.run("pid", None)
    assert os.getpriority(os.PRIO_PROCESS, child) == min(
        os.getpriority(os.PRIO_PROCESS, 0) + CHILD_NICENESS, 19
    )
    assert os.sched_getscheduler(child) == os.SCHED_OTHER


async def test_timeout_kills_and_replaces_the_process(make_pool: MakePool) -> None:
    pool = await make_pool()
    before = await pool.run("pid", None)
    with pytest.raises(WorkerError, match="exceeded its 100 ms timeout") as caught:
        await pool.run("sleep_ms", 10_000, timeout_ms=100)
    assert caught.value.code == "worker.task_timeout"
    assert await pool.run("echo", "next") == "next"
    assert await pool.run("pid", None) != before
    # A deliberate kill is not a crash: the restart budget is untouched.
    assert pool.stats() == {"busy": 0, "queued": 0, "size": 1, "restarts": 0, "broken": False}


async def test_crash_rejects_in_flight_and_replaces(make_pool: MakePool) -> None:
    pool = await make_pool()
    crashes: list[dict[str, Any]] = []
    pool.on("crash", crashes.append)
    before = await pool.run("pid", None)
    with pytest.raises(WorkerError, match="exited with code 3 while running exit_now") as caught:
        await pool.run("exit_now", None)
    assert caught.value.code == "worker.crashed"
    assert await pool.run("echo", "next") == "next"
    assert await pool.run("pid", None) != before
    assert pool.stats()["restarts"] == 1
    await pool.stop()
    assert [(c["worker"], c["exit_code"], c["task"], c["pid"]) for c in crashes] == [
        ("TestWorker", 3, "exit_now", before)
    ]


async def test_kill_one_kills_the_busy_child_first_and_counts_a_restart(
    make_pool: MakePool, tmp_path: Path
) -> None:
    pool = await make_pool(pool_size=2)
    crashes: list[dict[str, Any]] = []
    pool.on("crash", crashes.append)
    running = asyncio.create_task(pool.run("block", str(tmp_path / "never")))
    await until(lambda: pool.stats()["busy"] == 1)
    idle_pid = await pool.run("pid", None)  # the other, idle child answers this one
    killed = pool.kill_one()
    assert killed is not None and killed != idle_pid  # the busy one goes first
    with pytest.raises(WorkerError, match=f"worker process {killed} .* while running block") as e:
        await running
    assert e.value.code == "worker.crashed"
    await until(lambda: pool.stats()["size"] == 2 and pool.stats()["restarts"] == 1)
    assert [(c["pid"], c["task"], c["exit_code"]) for c in crashes] == [(killed, "block", -9)]
    assert await pool.run("echo", "after") == "after"


async def test_each_replacement_is_a_replaced_signal_with_both_pids_and_its_time(
    make_pool: MakePool,
) -> None:
    """A crash's dip in `size` lasts a fraction of a second: `replaced` is what says it
    happened, which child took the dead one's place, and how long that took."""
    pool = await make_pool()
    replaced: list[dict[str, Any]] = []
    pool.on("replaced", replaced.append)
    crashed_pid = await pool.run("pid", None)
    await code_of(pool.run("exit_now", None))
    timed_out_pid = await pool.run("pid", None)
    await code_of(pool.run("sleep_ms", 10_000, timeout_ms=100))
    killed_pid = await pool.run("pid", None)
    assert pool.kill_one() == killed_pid
    await until(lambda: len(replaced) == 3)
    last_pid = await pool.run("pid", None)
    assert [(r["worker"], r["pid"], r["reason"], r["restarts"]) for r in replaced] == [
        ("TestWorker", crashed_pid, "crashed", 1),
        ("TestWorker", timed_out_pid, "timeout", 1),  # a timeout's kill is free
        ("TestWorker", killed_pid, "killed", 2),
    ]
    assert [r["new_pid"] for r in replaced] == [timed_out_pid, killed_pid, last_pid]
    assert all(0 < r["ms"] < 5_000 for r in replaced), replaced


async def test_kill_one_takes_an_idle_child_and_never_the_same_one_twice(
    make_pool: MakePool,
) -> None:
    pool = await make_pool(pool_size=2)
    first, second = pool.kill_one(), pool.kill_one()
    assert first is not None and second is not None and first != second
    await until(lambda: pool.stats()["size"] == 2 and pool.stats()["restarts"] == 2)
    assert await pool.run("pid", None) not in (first, second)
    assert pool.stats()["broken"] is False


async def test_kill_one_has_nothing_to_kill_in_thread_mode_or_when_stopped(
    make_pool: MakePool,
) -> None:
    threads = await make_pool(mode="thread")
    assert threads.kill_one() is None
    pool = await make_pool()
    await pool.stop()
    assert pool.kill_one() is None


async def test_pool_breaks_after_max_restarts(make_pool: MakePool) -> None:
    pool = await make_pool(max_restarts=1)
    assert await code_of(pool.run("exit_now", None)) == "worker.crashed"
    assert await pool.run("echo", 1) == 1
    assert await code_of(pool.run("exit_now", None)) == "worker.crashed"
    await until(lambda: pool.stats()["broken"])
    with pytest.raises(WorkerError, match="pool TestWorker is broken after 1 restarts") as caught:
        await pool.run("echo", 1)
    assert caught.value.code == "worker.crashed"
    assert pool.stats()["restarts"] == 1


async def test_breaking_rejects_the_queue(make_pool: MakePool) -> None:
    pool = await make_pool(max_restarts=0)
    crashing = asyncio.create_task(pool.run("exit_now", None))
    queued = asyncio.create_task(pool.run("echo", 1))
    results = await asyncio.gather(crashing, queued, return_exceptions=True)
    assert [type(r) for r in results] == [WorkerError, WorkerError]
    assert [r.code for r in results if isinstance(r, WorkerError)] == ["worker.crashed"] * 2
    assert "broken after 0 restarts" in str(results[1])


async def test_stop_rejects_the_queue_and_waits_for_in_flight(
    make_pool: MakePool, tmp_path: Path
) -> None:
    pool = await make_pool()
    stopped: list[dict[str, Any]] = []
    pool.on("stopped", stopped.append)
    release = tmp_path / "release"
    running = asyncio.create_task(pool.run("block", str(release)))
    queued = [asyncio.create_task(pool.run("echo", n)) for n in range(2)]
    await until(lambda: pool.stats()["queued"] == 2)
    stopping = asyncio.create_task(pool.stop(timeout_s=5))
    await until(lambda: all(task.done() for task in queued))
    assert [await code_of(task) for task in queued] == ["worker.stopped"] * 2
    assert not running.done()
    release.touch()
    await stopping
    assert await running == str(release)
    assert await code_of(pool.run("echo", 1)) == "worker.stopped"
    assert pool.stats() == {"busy": 0, "queued": 0, "size": 0, "restarts": 0, "broken": False}
    assert [(e["rejected"], e["interrupted"]) for e in stopped] == [(2, 0)]


async def test_stop_interrupts_a_task_past_its_timeout(make_pool: MakePool, tmp_path: Path) -> None:
    pool = await make_pool()
    running = asyncio.create_task(pool.run("block", str(tmp_path / "never")))
    await until(lambda: pool.stats()["busy"] == 1)
    await pool.stop(timeout_s=0.05)
    assert await code_of(running) == "worker.stopped"
    assert pool.stats()["size"] == 0


async def test_full_queue_fails_at_once_with_retry_after(
    make_pool: MakePool, tmp_path: Path
) -> None:
    pool = await make_pool(max_queue=1)
    release = tmp_path / "release"
    running = asyncio.create_task(pool.run("block", str(release)))
    queued = asyncio.create_task(pool.run("echo", "queued"))
    await until(lambda: pool.stats()["queued"] == 1)
    with pytest.raises(WorkerOverloaded) as caught:
        await pool.run("echo", "one too many")
    assert caught.value.code == "worker.overloaded"
    assert isinstance(caught.value.retry_after_s, int)
    assert caught.value.retry_after_s >= 1
    release.touch()
    assert list(await asyncio.gather(running, queued)) == [str(release), "queued"]


async def test_cancelled_queued_caller_never_runs(make_pool: MakePool, tmp_path: Path) -> None:
    pool = await make_pool()
    release, marker = tmp_path / "release", tmp_path / "marker"
    running = asyncio.create_task(pool.run("block", str(release)))
    queued = asyncio.create_task(pool.run("touch", str(marker)))
    await until(lambda: pool.stats()["queued"] == 1)
    queued.cancel()
    with pytest.raises(asyncio.CancelledError):
        await queued
    assert pool.stats()["queued"] == 0
    release.touch()
    await running
    assert await pool.run("echo", "after") == "after"
    assert not marker.exists()


async def test_events_are_a_closed_set_and_fire_in_order(make_pool: MakePool) -> None:
    pool = await make_pool()
    with pytest.raises(ValueError, match="unknown signal 'finished'"):
        pool.on("finished", print)
    seen: list[tuple[str, str | None, str | None]] = []
    for name in ("dispatch", "done", "fail", "stopped"):
        pool.on(name, lambda e: seen.append((e["signal"], e.get("task"), e.get("code"))))
    await pool.run("echo", 1)
    await code_of(pool.run("boom", None))
    await pool.stop()
    assert seen == [
        ("dispatch", "echo", None),
        ("done", "echo", None),
        ("dispatch", "boom", None),
        ("fail", "boom", "worker.task_failed"),
        ("stopped", None, None),
    ]


# -- thread mode -------------------------------------------------------------------------------


async def test_thread_mode_runs_tasks_and_reports_errors(make_pool: MakePool) -> None:
    pool = await make_pool(mode="thread", pool_size=2)
    value = {"shared": [1]}
    assert await pool.run("echo", value) is value  # threads pass args by reference
    assert await pool.run("double", 4) == 8
    with pytest.raises(TaskFailed, match="raised ValueError: bad") as caught:
        await pool.run("boom", None)
    assert caught.value.exc_type == "ValueError"
    assert await code_of(pool.run("nope", None)) == "worker.unknown_task"
    assert pool.stats() == {"busy": 0, "queued": 0, "size": 2, "restarts": 0, "broken": False}


async def test_thread_mode_timeout_reports_but_keeps_the_slot_busy(
    make_pool: MakePool, tmp_path: Path
) -> None:
    pool = await make_pool(mode="thread")
    release = tmp_path / "release"
    with pytest.raises(WorkerError, match="the thread runs on") as caught:
        await pool.run("block", str(release), timeout_ms=50)
    assert caught.value.code == "worker.task_timeout"
    assert pool.stats()["busy"] == 1
    release.touch()
    assert await pool.run("echo", "next") == "next"
    assert pool.stats()["busy"] == 0


async def test_children_run_at_a_lower_priority_than_the_web_process(make_pool: MakePool) -> None:
    import os

    from mega.workers.child import CHILD_NICENESS

    pool = await make_pool()
    child = await pool.run("pid", None)
    parent_nice = os.getpriority(os.PRIO_PROCESS, 0)
    # The event loop gets the CPU first when every core hashes.
    assert os.getpriority(os.PRIO_PROCESS, child) == min(19, parent_nice + CHILD_NICENESS)
