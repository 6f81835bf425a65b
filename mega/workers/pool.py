"""WorkerPool: the runtime of a Worker declaration (`ctx.workers[name]`).

This module holds the pool: the bounded FIFO queue, dispatch to idle slots, task timeouts,
progress reports, crash replacement and the broken state, stop(), stats() and signals. A slot
is one child process (`mega.workers.process.WorkerProcess`, which owns its pipes) or, in
thread mode, one thread of an executor. Each slot runs one task at a time; callers beyond the
idle slots wait in the queue. Children talk length-prefixed pickle frames driven from the
event loop itself: no multiprocessing queues and no feeder threads, which is where most of
`concurrent.futures.ProcessPoolExecutor`'s per-task cost goes.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import importlib
import logging
import math
import pickle
import time
from collections import deque
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ParamSpec, TypeVar, overload

from mega import tracing
from mega.errors import TaskFailed, WorkerError, WorkerOverloaded
from mega.signals import Signals
from mega.tasks import wait_event
from mega.workers.child import (
    PICKLE_PROTOCOL,
    STATUS_BAD_ARGS,
    STATUS_OK,
    STATUS_TASK_FAILED,
    STATUS_UNKNOWN_TASK,
    Task,
    call_task,
    encode_frame,
    task_functions,
)
from mega.workers.process import WorkerProcess, child_env
from mega.workers.task_progress import ProgressReporter, install
from mega.workers.worker import Worker

P = ParamSpec("P")
R = TypeVar("R")
logger = logging.getLogger("mega.worker")

SIGNALS = frozenset({"dispatch", "done", "fail", "crash", "replaced", "stopped"})  # .on()
CHILD_EXIT_GRACE_S = 2.0  # after closing a child's stdin, how long it gets before SIGKILL
DEFAULT_STOP_TIMEOUT_S = 10.0  # how long stop() waits for in-flight tasks by default
RETRY_AFTER_SMOOTHING = 0.2  # weight of the newest task duration in the Retry-After estimate

# run(on_progress=...): called on the event loop with (fraction 0..1, note or None).
ProgressCallback = Callable[[float, str | None], None]


@dataclass(eq=False)
class _Task:
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
class _Slot:
    """One unit of the pool: a child process, or (child None) one thread of the executor."""

    child: WorkerProcess | None = None
    task: _Task | None = None
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


def _settle(task: _Task, value: Any = None, error: BaseException | None = None) -> None:
    # A caller that was cancelled has a done future; its task's outcome is simply dropped.
    if task.future.done():
        return
    if error is None:
        task.future.set_result(value)
    else:
        task.future.set_exception(error)


class WorkerPool:
    """The runtime of one Worker declaration; `ctx.workers[name]` is one of these.

    `await start()`, then `await run(task_name, args, timeout_ms=None, on_progress=None)` from
    coroutines of the same event loop, and `await stop()` at shutdown; `kill_one()` plays a
    crash on purpose. Signals, each with `signal` and `worker`:
    `dispatch` (task, task_id, queued_ms), `done` (task, task_id, ms), `fail` (task, task_id,
    ms, code, error), `crash` (pid, exit_code, task or None, restarts), `replaced` (pid,
    new_pid, reason, ms, restarts) and `stopped` (rejected, interrupted). Observers run in
    order on a separate task, never inline.
    """

    def __init__(self, worker: type[Worker], *, root: Path | str | None = None) -> None:
        """A pool for `worker`, not started yet: `await start()` starts its slots.

        Args:
            worker: the Worker subclass, validated here (`Worker.validate`: RegistrationError
                names each bad field, and its task module is imported).
            root: the project root its `task_file` is found from, and the first entry of the
                children's PYTHONPATH; None is the current directory.
        """
        self.settings = worker.validate(root)
        self.name = self.settings.name
        self.signals = Signals(SIGNALS)
        self._state = "new"  # -> running -> stopping -> stopped
        self._broken = False
        self._restarts = 0
        self._slots: set[_Slot] = set()  # live slots, busy or idle
        self._idle: deque[_Slot] = deque()
        self._queue: deque[_Task] = deque()
        self._next_id = 0
        self._avg_task_s = 0.0  # smoothed task duration, for the Retry-After hint
        self._runners: set[asyncio.Task[None]] = set()  # child watchers and thread waiters
        self._drained = asyncio.Event()  # set once stop() has no task in flight left
        self._stopped = asyncio.Event()  # set when stop() has finished
        self._pending_signals: deque[tuple[str, dict[str, Any]]] = deque()
        self._event_pump: asyncio.Task[None] | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._functions: dict[str, Task] = {}
        self._child_env = child_env(self.settings.root)  # os.environ as of construction

    def on(self, name: str, observer: Callable[[dict[str, Any]], Any]) -> Callable[[], None]:
        """Observe a signal; an unknown name raises ValueError. Returns an unsubscribe function.

        Args:
            name: "dispatch", "done", "fail", "crash", "replaced" or "stopped".
            observer: called with each signal as one dict: `signal`, `worker` and that
                signal's fields (see the class). It may be async.
        """
        return self.signals.on(name, observer)

    def stats(self) -> dict[str, Any]:
        """`busy` slots running a task, `queued` waiting tasks, `size` live slots (processes or
        threads), `restarts` crash replacements so far, `broken` once past max_restarts."""
        busy = sum(1 for slot in self._slots if slot.task is not None)
        return {
            "busy": busy,
            "queued": len(self._queue),
            "size": len(self._slots),
            "restarts": self._restarts,
            "broken": self._broken,
        }

    async def start(self) -> None:
        """Start pool_size children (process mode: each imports the task module) or threads."""
        if self._state != "new":
            raise RuntimeError(f"pool {self.name} was already started")
        self._state = "running"
        if self.settings.mode == "thread":
            self._functions = task_functions(importlib.import_module(self.settings.module))
            self._executor = ThreadPoolExecutor(
                self.settings.pool_size, thread_name_prefix=f"mega-worker-{self.name}"
            )
            for _ in range(self.settings.pool_size):
                self._add_slot(_Slot())
            return
        spawned = await asyncio.gather(
            *(self._spawn() for _ in range(self.settings.pool_size)), return_exceptions=True
        )
        for outcome in spawned:
            if not isinstance(outcome, BaseException):
                self._add_slot(outcome)
        failures = [outcome for outcome in spawned if isinstance(outcome, BaseException)]
        if failures:
            await self.stop(timeout_s=0)
            raise failures[0]

    @overload
    async def run(
        self, task: Callable[P, Awaitable[R]], /, *args: P.args, **kwargs: P.kwargs
    ) -> R: ...
    @overload
    async def run(self, task: Callable[P, R], /, *args: P.args, **kwargs: P.kwargs) -> R: ...
    @overload
    async def run(
        self,
        task: str,
        /,
        args: Any = None,
        timeout_ms: float | None = None,
        on_progress: ProgressCallback | None = None,
    ) -> Any: ...

    async def run(self, task: Any, /, *args: Any, **kwargs: Any) -> Any:
        """Run a task of this pool and return what it returns.

        `await pool.run(sha256_loop, data, rounds=3)`: the task's function itself, called
        with those arguments in the child, typed as the function is (its parameters, its
        return). `await pool.run("sha256_loop", args, timeout_ms=, on_progress=)`: the task
        by name, called as `sha256_loop(args)`, with a timeout and a progress callback.

        Args:
            task: the task's function itself, a function of the pool's task module (else
                WorkerError `worker.unknown_task`), or its name.
            *args: the function's positional arguments; after a name, those of `run_task`
                (`args`, `timeout_ms`, `on_progress`).
            **kwargs: the function's keyword arguments; after a name, those of `run_task`.
        """
        if isinstance(task, str):
            return await self.run_task(task, *args, **kwargs)
        name = getattr(task, "__name__", "")
        if getattr(task, "__module__", None) != self.settings.module:
            raise WorkerError(
                f"pool {self.name} runs the tasks of {self.settings.module}, not {task!r}",
                code="worker.unknown_task",
            )
        return await self._submit(name, (args, kwargs), None, None, spread=True)

    async def run_task(
        self,
        task_name: str,
        args: Any = None,
        timeout_ms: float | None = None,
        on_progress: ProgressCallback | None = None,
    ) -> Any:
        """Run `task_name(args)` on an idle slot (or after the tasks queued before it) and return
        its return value unchanged.

        Raises WorkerError with code worker.invalid_args, worker.unknown_task,
        worker.task_timeout, worker.crashed, worker.stopped, worker.overloaded
        (WorkerOverloaded) or worker.task_failed (TaskFailed).

        Args:
            task_name: the name of a public top-level function of the task module.
            args: the one argument the task is called with. Process mode pickles it here;
                thread mode passes it by reference (no copy, so no worker.invalid_args).
            timeout_ms: milliseconds (> 0, else ValueError), counted from dispatch, not from
                queueing: past it the caller gets worker.task_timeout and, in process mode,
                the child is killed and replaced (this does not spend max_restarts). None: no
                limit.
            on_progress: called as `on_progress(fraction, note)` on the event loop each time
                the task reports with `mega.workers.progress` (at most every 50 ms, the last
                report always before the result); an exception it raises is logged, not
                propagated. None: the task's reports go nowhere.
        """
        return await self._submit(task_name, args, timeout_ms, on_progress, spread=False)

    async def _submit(
        self,
        task_name: str,
        args: Any,
        timeout_ms: float | None,
        on_progress: ProgressCallback | None,
        *,
        spread: bool,
    ) -> Any:
        """Queue or dispatch one call of `task_name` (spread: `args` is (positional, keywords)
        to call it with), and wait for its result."""
        self._check_open()
        if task_name not in self.settings.task_names:
            known = ", ".join(sorted(self.settings.task_names))
            message = f"pool {self.name} has no task {task_name!r} (tasks: {known})"
            raise WorkerError(message, code="worker.unknown_task")
        if timeout_ms is not None and not timeout_ms > 0:
            raise ValueError(f"timeout_ms must be > 0 or None, got {timeout_ms!r}")
        self._next_id += 1
        payload = args
        if self._executor is None:
            try:
                args_pickle = pickle.dumps(args, protocol=PICKLE_PROTOCOL)
            except Exception as exc:
                message = f"args for {self.name}.{task_name} cannot be pickled: {exc}"
                raise WorkerError(message, code="worker.invalid_args") from exc
            # The child sends progress frames only for a caller that listens to them.
            payload = encode_frame(
                (self._next_id, task_name, args_pickle, on_progress is not None, spread)
            )
        future = asyncio.get_running_loop().create_future()
        task = _Task(
            self._next_id,
            task_name,
            payload,
            timeout_ms,
            future,
            time.perf_counter(),
            on_progress=on_progress,
            spread=spread,
        )
        if self._idle:
            self._dispatch(self._idle.popleft(), task)
        elif len(self._queue) >= self.settings.max_queue:
            raise self._overloaded()
        else:
            self._queue.append(task)
        if tracing.tracer() is None:
            return await self._result(task, future)
        with tracing.internal(
            f"pool {self.name}.{task_name}",
            **{
                "mega.pool": self.name,
                "mega.task": task_name,
            },
        ):
            return await self._result(task, future)

    async def _result(self, task: _Task, future: asyncio.Future[Any]) -> Any:
        try:
            return await future
        except asyncio.CancelledError:
            # Still waiting: it must never run. Already running: it finishes (or times out).
            if task in self._queue:
                self._queue.remove(task)
            raise

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

    async def stop(self, timeout_s: float = DEFAULT_STOP_TIMEOUT_S) -> None:
        """Refuse new runs, reject queued tasks with worker.stopped, wait up to `timeout_s`
        seconds for tasks in flight, then end the children (stdin closed, SIGKILL after
        CHILD_EXIT_GRACE_S). Tasks still running then are rejected with worker.stopped.
        Thread mode cannot kill a running thread: it runs on, its result discarded.
        Emits `stopped` with `rejected` (queued) and `interrupted` (in flight) counts.

        Args:
            timeout_s: how long tasks in flight get, in seconds; 0 gives them none. A call
                made while the pool is already stopping waits for that stop to end instead.
        """
        if self._state in ("stopping", "stopped"):
            await self._stopped.wait()
            return
        self._state = "stopping"
        rejected = len(self._queue)
        while self._queue:
            task = self._queue.popleft()
            _settle(task, error=self._stopped_error(f"{task.name} was still queued"))
        self._check_drained()
        await wait_event(self._drained, timeout_s)
        interrupted = 0
        for slot in self._slots:
            if slot.timer is not None:
                slot.timer.cancel()
            if slot.task is not None:
                interrupted += 1
                reason = f"{slot.task.name} did not finish within {timeout_s} s"
                _settle(slot.task, error=self._stopped_error(reason))
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
            for runner in self._runners:
                runner.cancel()
        else:
            await self._end_children()
        while self._runners:  # a replacement may have started meanwhile: wait for it too
            await asyncio.wait(set(self._runners))
        self._state = "stopped"
        self._emit("stopped", rejected=rejected, interrupted=interrupted)
        if self._event_pump is not None:
            await self._event_pump
        self._stopped.set()

    # -- dispatch and results ---------------------------------------------------------------

    def _dispatch(self, slot: _Slot, task: _Task) -> None:
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

    def _complete(self, slot: _Slot, status: int, value: Any) -> None:
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
                _settle(task, value)
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

    def _child_progress(self, slot: _Slot, value: tuple[float, str | None]) -> None:
        # A child runs one task at a time, so the frame is its current task's; after a timeout
        # the slot has no task and the late frame is dropped.
        if slot.task is not None:
            self._report(slot.task, *value)

    def _report(self, task: _Task, fraction: float, note: str | None) -> None:
        if task.on_progress is None or task.future.done():
            return
        try:
            task.on_progress(fraction, note)
        except Exception:
            logger.exception("on_progress of %s.%s raised; the task runs on", self.name, task.name)

    def _task_error(self, task: _Task, status: int, value: Any) -> WorkerError:
        exc_type, message = value
        if status == STATUS_UNKNOWN_TASK:
            return WorkerError(f"pool {self.name}: {message}", code="worker.unknown_task")
        if status == STATUS_BAD_ARGS:
            text = f"args for {self.name}.{task.name} cannot be unpickled in the child: {message}"
            return WorkerError(text, code="worker.invalid_args")
        text = f"task {task.name} of pool {self.name} raised {exc_type}: {message}"
        return TaskFailed(text, exc_type=exc_type)

    def _fail(self, task: _Task, error: WorkerError) -> None:
        _settle(task, error=error)
        ms = round((time.perf_counter() - task.started_at) * 1000, 3)
        fields = {"task": task.name, "task_id": task.task_id, "ms": ms}
        self._emit("fail", **fields, code=error.code, error=error.message)

    def _on_timeout(self, slot: _Slot, task: _Task) -> None:
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

    def _thread_reporter(self, task: _Task) -> ProgressReporter:
        """A reporter for a task in an executor thread: each report hops to the event loop."""
        loop = asyncio.get_running_loop()

        def send(fraction: float, note: str | None) -> None:
            loop.call_soon_threadsafe(self._report, task, fraction, note)

        return ProgressReporter(send)

    async def _run_in_thread(self, slot: _Slot, task: _Task) -> None:
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

    # -- child processes --------------------------------------------------------------------

    async def _spawn(self) -> _Slot:
        """Start one child and wait for its hello; WorkerError(worker.crashed) if it fails."""
        slot = _Slot()
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

    async def _watch(self, slot: _Slot) -> None:
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
                _settle(task, error=self._stopped_error(f"{task.name} was interrupted"))
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
                _settle(self._queue.popleft(), error=self._broken_error())
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

    # -- bookkeeping ------------------------------------------------------------------------

    def _add_slot(self, slot: _Slot) -> None:
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

    def _check_open(self) -> None:
        if self._state != "running":
            reason = "not started" if self._state == "new" else "stopped"
            raise WorkerError(f"pool {self.name} is {reason}", code="worker.stopped")
        if self._broken:
            raise self._broken_error()

    def _broken_error(self) -> WorkerError:
        message = (
            f"pool {self.name} is broken after {self._restarts} restarts; "
            "fix the crash (see the worker's stderr) and restart the app"
        )
        return WorkerError(message, code="worker.crashed")

    def _stopped_error(self, reason: str) -> WorkerError:
        return WorkerError(f"pool {self.name} stopped: {reason}", code="worker.stopped")

    def _overloaded(self) -> WorkerOverloaded:
        waiting = len(self._queue) + 1
        retry_after_s = max(1, math.ceil(self._avg_task_s * waiting / self.settings.pool_size))
        message = (
            f"pool {self.name} is overloaded: all {self.settings.pool_size} workers are busy "
            f"and {len(self._queue)} tasks are queued (max_queue); retry in {retry_after_s} s"
        )
        return WorkerOverloaded(message, retry_after_s=retry_after_s)

    def _emit(self, name: str, **fields: Any) -> None:
        """Queue a signal for the observers; one pump delivers them in order, off the hot path."""
        if not self.signals.has_observers(name):
            return
        self._pending_signals.append((name, fields))
        if self._event_pump is None or self._event_pump.done():
            self._event_pump = asyncio.get_running_loop().create_task(self._pump_signals())

    async def _pump_signals(self) -> None:
        while self._pending_signals:
            name, fields = self._pending_signals.popleft()
            await self.signals.emit(name, worker=self.name, **fields)
