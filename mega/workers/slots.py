"""The slots of a WorkerPool (mega/workers/pool.py): `PoolSlots`, its base class, keeps each
slot's life. A slot is one child process (`mega.workers.process.WorkerProcess`, which owns its
pipes) or, in thread mode, one thread of an executor, and runs one task at a time:

- a task dispatched to it, its answer (the task settled, the slot given the next queued task),
  its progress reports and its timeout (a child killed and replaced; a thread runs on);
- a child's exit: its task failed as `worker.crashed` unless the pool killed it on purpose,
  one restart of `max_restarts` spent, a replacement started (past them the pool is broken);
- at stop, the children ended: stdin closed, SIGKILL after `CHILD_EXIT_GRACE_S`.

The pool itself (the bounded queue, `run`, `stop`, stats and signals) is WorkerPool's.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from mega.errors import TaskFailed, WorkerError
from mega.workers.child import (
    STATUS_BAD_ARGS,
    STATUS_OK,
    STATUS_TASK_FAILED,
    STATUS_UNKNOWN_TASK,
    Task,
    call_task,
)
from mega.workers.process import WorkerProcess
from mega.workers.task_progress import ProgressReporter, install
from mega.workers.worker import WorkerSettings

logger = logging.getLogger("mega.worker")

CHILD_EXIT_GRACE_S = 2.0  # after closing a child's stdin, how long it gets before SIGKILL
RETRY_AFTER_SMOOTHING = 0.2  # weight of the newest task duration in the Retry-After estimate

# run(on_progress=...): called on the event loop with (fraction 0..1, note or None).
ProgressCallback = Callable[[float, str | None], None]


@dataclass(eq=False)
class PoolTask:
    """One call of a task, queued or running: its future is what `run` awaits."""

    task_id: int
    name: str
    payload: Any  # process mode: the encoded frame; thread mode: the args themselves
    timeout_ms: float | None
    future: asyncio.Future[Any]
    queued_at: float
    started_at: float = 0.0
    timed_out: bool = False
    on_progress: ProgressCallback | None = None
    spread: bool = False  # payload (thread mode) is (positional, keywords) to call it with


@dataclass(eq=False)
class Slot:
    """One unit of the pool: a child process, or (child None) one thread of the executor."""

    child: WorkerProcess | None = None
    task: PoolTask | None = None
    timer: asyncio.TimerHandle | None = None
    retiring: bool = False  # killed on purpose after a timeout: its exit is not a crash
    killed: bool = False  # SIGKILLed by kill_one(): gone, though its exit is not yet seen


def _call_reporting(reporter: ProgressReporter, fn: Task, args: Any, spread: bool) -> Any:
    """Thread mode with a progress callback: call_task with progress() routed to `reporter`."""
    install(reporter)
    try:
        return call_task(fn, args, spread)
    finally:
        reporter.finish()
        install(None)


def settle(task: PoolTask, value: Any = None, error: BaseException | None = None) -> None:
    """Give `task`'s caller its value, or its error. A caller that was cancelled has a done
    future: its task's outcome is simply dropped."""
    if task.future.done():
        return
    if error is None:
        task.future.set_result(value)
    else:
        task.future.set_exception(error)


class PoolSlots:
    """The slots of one pool and their lives (see the module). What it needs of WorkerPool:
    its settings and name, its state and queue, and `_emit` for its signals."""

    settings: WorkerSettings
    name: str
    _state: str
    _broken: bool
    _restarts: int
    _slots: set[Slot]
    _idle: deque[Slot]
    _queue: deque[PoolTask]
    _avg_task_s: float
    _runners: set[asyncio.Task[None]]
    _drained: asyncio.Event
    _executor: ThreadPoolExecutor | None
    _functions: dict[str, Task]
    _child_env: dict[str, str]

    def _emit(self, name: str, **fields: Any) -> None:
        raise NotImplementedError  # WorkerPool's

    def kill_one(self) -> int | None:
        """SIGKILL one child process, as a crash would: one running a task if there is one, else
        an idle one. Returns its pid, or None when there is none to kill (thread mode, a pool
        not running, every child already gone).

        The pool handles it as any crash: the task it was running fails with worker.crashed,
        a `crash` signal is emitted and a replacement starts, spending one of max_restarts
        (past them the pool is broken). For demos and chaos tests.
        """
        if self._executor is not None or self._state != "running":
            return None
        alive = [slot for slot in self._slots if not (slot.killed or slot.retiring)]
        busy = [slot for slot in alive if slot.task is not None]
        if not alive:
            return None
        slot = (busy or alive)[0]
        assert slot.child is not None
        slot.killed = True
        with contextlib.suppress(ValueError):
            self._idle.remove(slot)  # nothing may be dispatched to it before _watch sees the exit
        slot.child.kill()
        return slot.child.pid

    def _dispatch(self, slot: Slot, task: PoolTask) -> None:
        slot.task = task
        task.started_at = time.perf_counter()
        if slot.child is not None:
            slot.child.send(task.payload)
        else:
            self._track(self._run_in_thread(slot, task))
        if task.timeout_ms is not None:
            loop = asyncio.get_running_loop()
            slot.timer = loop.call_later(task.timeout_ms / 1000, self._on_timeout, slot, task)
        queued_ms = round((task.started_at - task.queued_at) * 1000, 3)
        self._emit("dispatch", task=task.name, task_id=task.task_id, queued_ms=queued_ms)

    def _complete(self, slot: Slot, status: int, value: Any) -> None:
        """A slot answered: settle its task (emit done/fail) and give the slot its next task."""
        task, slot.task = slot.task, None
        if slot.timer is not None:
            slot.timer.cancel()
            slot.timer = None
        if task is not None and not task.timed_out:
            elapsed_s = time.perf_counter() - task.started_at
            self._avg_task_s += RETRY_AFTER_SMOOTHING * (elapsed_s - self._avg_task_s)
            ms = round(elapsed_s * 1000, 3)
            if status == STATUS_OK:
                settle(task, value)
                self._emit("done", task=task.name, task_id=task.task_id, ms=ms)
            else:
                self._fail(task, self._task_error(task, status, value))
        if slot.retiring or slot.killed:
            return  # its child is dead, its answer was already in the pipe: _watch replaces it
        if self._state == "running" and not self._broken and self._queue:
            self._dispatch(slot, self._queue.popleft())
        else:
            self._idle.append(slot)
            self._check_drained()

    def _child_progress(self, slot: Slot, value: tuple[float, str | None]) -> None:
        # A child runs one task at a time, so the frame is its current task's; after a timeout
        # the slot has no task and the late frame is dropped.
        if slot.task is not None:
            self._report(slot.task, *value)

    def _report(self, task: PoolTask, fraction: float, note: str | None) -> None:
        if task.on_progress is None or task.future.done():
            return
        try:
            task.on_progress(fraction, note)
        except Exception:
            logger.exception("on_progress of %s.%s raised; the task runs on", self.name, task.name)

    def _task_error(self, task: PoolTask, status: int, value: Any) -> WorkerError:
        exc_type, message = value
        if status == STATUS_UNKNOWN_TASK:
            return WorkerError(f"pool {self.name}: {message}", code="worker.unknown_task")
        if status == STATUS_BAD_ARGS:
            text = f"args for {self.name}.{task.name} cannot be unpickled in the child: {message}"
            return WorkerError(text, code="worker.invalid_args")
        text = f"task {task.name} of pool {self.name} raised {exc_type}: {message}"
        return TaskFailed(text, exc_type=exc_type)

    def _fail(self, task: PoolTask, error: WorkerError) -> None:
        settle(task, error=error)
        ms = round((time.perf_counter() - task.started_at) * 1000, 3)
        fields = {"task": task.name, "task_id": task.task_id, "ms": ms}
        self._emit("fail", **fields, code=error.code, error=error.message)

    def _on_timeout(self, slot: Slot, task: PoolTask) -> None:
        slot.timer = None
        if slot.task is not task:
            return
        task.timed_out = True
        message = f"task {task.name} of pool {self.name} exceeded its {task.timeout_ms} ms timeout"
        if slot.child is None:
            # A thread cannot be killed: the slot stays busy until the function returns.
            message += " (thread mode: the thread runs on until the function returns)"
        self._fail(task, WorkerError(message, code="worker.task_timeout"))
        if slot.child is not None:
            slot.task, slot.retiring = None, True
            slot.child.kill()  # _watch sees the exit and starts a replacement

    def _thread_reporter(self, task: PoolTask) -> ProgressReporter:
        """A reporter for a task in an executor thread: each report hops to the event loop."""
        loop = asyncio.get_running_loop()

        def send(fraction: float, note: str | None) -> None:
            loop.call_soon_threadsafe(self._report, task, fraction, note)

        return ProgressReporter(send)

    async def _run_in_thread(self, slot: Slot, task: PoolTask) -> None:
        loop = asyncio.get_running_loop()
        fn = self._functions[task.name]
        try:
            if task.on_progress is None:
                value = await loop.run_in_executor(
                    self._executor, call_task, fn, task.payload, task.spread
                )
            else:
                reporter = self._thread_reporter(task)
                value = await loop.run_in_executor(
                    self._executor, _call_reporting, reporter, fn, task.payload, task.spread
                )
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # SystemExit too: a thread's sys.exit() is a task failure
            self._complete(slot, STATUS_TASK_FAILED, (type(exc).__name__, str(exc)))
        else:
            self._complete(slot, STATUS_OK, value)

    async def _spawn(self) -> Slot:
        """Start one child and wait for its hello; WorkerError(worker.crashed) if it fails."""
        slot = Slot()
        slot.child = await WorkerProcess.start(
            self.settings.module,
            root=self.settings.root,
            env=self._child_env,
            on_frame=functools.partial(self._complete, slot),
            on_progress=functools.partial(self._child_progress, slot),
            pool=self.name,
        )
        self._track(self._watch(slot))
        return slot

    async def _watch(self, slot: Slot) -> None:
        """Once a child exits: settle its task, count a crash (unless retiring), replace it."""
        assert slot.child is not None
        await slot.child.stdout_closed()
        # Out of the idle set before awaiting its exit, so no task is dispatched to it meanwhile.
        self._slots.discard(slot)
        with contextlib.suppress(ValueError):
            self._idle.remove(slot)
        if slot.timer is not None:
            slot.timer.cancel()
        gone_at = time.perf_counter()  # the pool is one child short from here
        exit_code = await slot.child.wait()
        task, slot.task = slot.task, None
        if self._state != "running":
            if task is not None:
                settle(task, error=self._stopped_error(f"{task.name} was interrupted"))
            self._check_drained()
            return
        if not slot.retiring:
            where = f"while running {task.name}" if task is not None else "while idle"
            message = (
                f"worker process {slot.child.pid} of pool {self.name} exited with code "
                f"{exit_code} {where}"
            )
            if task is not None:
                self._fail(task, WorkerError(message, code="worker.crashed"))
            self._emit(
                "crash",
                pid=slot.child.pid,
                exit_code=exit_code,
                task=task.name if task is not None else None,
                restarts=self._restarts,
            )
            if not self._count_restart():
                return
        reason = "timeout" if slot.retiring else "killed" if slot.killed else "crashed"
        await self._replace(slot.child.pid, reason, gone_at)

    async def _replace(self, old_pid: int, reason: str, gone_at: float) -> None:
        """Start a child in place of one that exited; a failed start counts as a crash.

        Emits `replaced` once the new child is ready: `pid` (the one that exited), `new_pid`,
        `reason` ("timeout": killed past a task's timeout_ms, "killed": by kill_one(),
        "crashed": any other exit) and `ms`, how long the pool ran one child short (the exit
        seen to the new child's hello; failed starts included). A crash's dip in `size` lasts
        about that long, often too short for a page that polls to see.
        """
        while self._state == "running" and not self._broken:
            try:
                slot = await self._spawn()
            except WorkerError as exc:
                logger.error("%s", exc)
                if not self._count_restart():
                    return
                continue
            if self._state != "running":
                assert slot.child is not None
                slot.child.close_stdin()  # stop() began while it started: let it exit at once
                self._slots.add(slot)
                return
            self._add_slot(slot)
            assert slot.child is not None
            self._emit(
                "replaced",
                pid=old_pid,
                new_pid=slot.child.pid,
                reason=reason,
                ms=round((time.perf_counter() - gone_at) * 1000, 3),
                restarts=self._restarts,
            )
            return

    def _count_restart(self) -> bool:
        """Spend one restart of the budget; past it, break the pool and return False."""
        if self._restarts >= self.settings.max_restarts:
            self._broken = True
            while self._queue:
                settle(self._queue.popleft(), error=self._broken_error())
            return False
        self._restarts += 1
        return True

    async def _end_children(self) -> None:
        for slot in list(self._slots):
            assert slot.child is not None
            if slot.task is None:
                slot.child.close_stdin()  # the child's read loop ends and it exits 0
            else:
                slot.child.kill()  # still busy past stop()'s timeout
        if self._runners:
            await asyncio.wait(set(self._runners), timeout=CHILD_EXIT_GRACE_S)
        for slot in list(self._slots):
            assert slot.child is not None
            if slot.child.returncode is None:
                slot.child.kill()

    def _add_slot(self, slot: Slot) -> None:
        self._slots.add(slot)
        if self._queue and not self._broken:
            self._dispatch(slot, self._queue.popleft())
        else:
            self._idle.append(slot)

    def _track(self, coro: Any) -> None:
        runner = asyncio.get_running_loop().create_task(coro)
        self._runners.add(runner)
        runner.add_done_callback(self._runners.discard)

    def _check_drained(self) -> None:
        if self._state == "stopping" and all(slot.task is None for slot in self._slots):
            self._drained.set()

    def _broken_error(self) -> WorkerError:
        message = (
            f"pool {self.name} is broken after {self._restarts} restarts; "
            "fix the crash (see the worker's stderr) and restart the app"
        )
        return WorkerError(message, code="worker.crashed")

    def _stopped_error(self, reason: str) -> WorkerError:
        return WorkerError(f"pool {self.name} stopped: {reason}", code="worker.stopped")
