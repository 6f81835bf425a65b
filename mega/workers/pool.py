"""WorkerPool: the runtime of a Worker declaration (`ctx.workers[name]`).

This module holds the pool: the bounded FIFO queue, run(), stop(), stats() and signals. Its
slots (child processes, or threads in thread mode) and their lives, dispatch, answers,
timeouts, progress, crash replacement and the broken state, are its base class's
(mega/workers/slots.py). Each slot runs one task at a time; callers beyond the idle slots wait
in the queue. Children talk length-prefixed pickle frames driven from the
event loop itself: no multiprocessing queues and no feeder threads, which is where most of
`concurrent.futures.ProcessPoolExecutor`'s per-task cost goes.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import math
import pickle
import time
from collections import deque
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, ParamSpec, TypeVar, overload

from mega import tracing
from mega.errors import WorkerError, WorkerOverloaded
from mega.signals import Signals
from mega.tasks import wait_event
from mega.workers.child import (
    PICKLE_PROTOCOL,
    Task,
    encode_frame,
    task_functions,
)
from mega.workers.process import child_env
from mega.workers.slots import PoolSlots, PoolTask, ProgressCallback, Slot, settle
from mega.workers.worker import Worker

P = ParamSpec("P")
R = TypeVar("R")
logger = logging.getLogger("mega.worker")

SIGNALS = frozenset({"dispatch", "done", "fail", "crash", "replaced", "stopped"})  # .on()
DEFAULT_STOP_TIMEOUT_S = 10.0  # how long stop() waits for in-flight tasks by default


class WorkerPool(PoolSlots):
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
        self._slots: set[Slot] = set()  # live slots, busy or idle
        self._idle: deque[Slot] = deque()
        self._queue: deque[PoolTask] = deque()
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
                self._add_slot(Slot())
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
        task = PoolTask(
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

    async def _result(self, task: PoolTask, future: asyncio.Future[Any]) -> Any:
        try:
            return await future
        except asyncio.CancelledError:
            # Still waiting: it must never run. Already running: it finishes (or times out).
            if task in self._queue:
                self._queue.remove(task)
            raise

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
            settle(task, error=self._stopped_error(f"{task.name} was still queued"))
        self._check_drained()
        await wait_event(self._drained, timeout_s)
        interrupted = 0
        for slot in self._slots:
            if slot.timer is not None:
                slot.timer.cancel()
            if slot.task is not None:
                interrupted += 1
                reason = f"{slot.task.name} did not finish within {timeout_s} s"
                settle(slot.task, error=self._stopped_error(reason))
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

    # -- bookkeeping ------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._state != "running":
            reason = "not started" if self._state == "new" else "stopped"
            raise WorkerError(f"pool {self.name} is {reason}", code="worker.stopped")
        if self._broken:
            raise self._broken_error()

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
