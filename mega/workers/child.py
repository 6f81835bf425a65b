"""The child process of a process-mode Worker pool, and the pipe protocol both sides speak.

Run as `python -P path/to/mega/workers/child.py <dotted task module>` by
`mega.workers.process.WorkerProcess`, one per slot of a `WorkerPool` (by path, so that
starting it never imports the `mega` package and all it re-exports). It
imports the task module once, then answers task frames until its stdin closes.

Protocol: every frame is a 4-byte big-endian length followed by that many bytes of pickle.
- child -> parent, once at startup: `(0, STATUS_READY, [task names])`, or
  `(0, STATUS_IMPORT_FAILED, (exc type name, message))` and exit.
- parent -> child: `(task_id, task_name, pickled args, reporting, spread)`. The args are pickled on
  their own, in the parent at dispatch, so a value the child cannot unpickle is reported
  against its task id instead of killing the child. `reporting`: whether the caller listens to
  progress; without it the task's progress() calls send nothing.
- child -> parent, while a task runs, only if it calls `mega.workers.progress` and the frame
  said `reporting`: any number of `(task_id, STATUS_PROGRESS, (fraction, note))`, throttled in
  the child (see `mega.workers.task_progress`), the last one always before the answer.
- child -> parent: `(task_id, STATUS_OK, return value)` or `(task_id, STATUS_*, (exc type name,
  message))`.

Keep this module light (standard library only, nothing from fastapi or the app): every pool
slot, and every replacement after a crash or timeout, pays its import time. The one framework
module it imports, `mega.workers.task_progress`, is standard library too (`mega` itself loads
its exports lazily).
"""

from __future__ import annotations

import contextlib
import importlib
import os
import pickle
import signal
import struct
import sys
import traceback
import types
from collections.abc import Callable
from typing import Any, BinaryIO

from mega.workers import task_progress

# Length prefix of every frame: unsigned 32-bit big-endian, so one frame holds up to 4 GiB.
FRAME_HEADER = struct.Struct(">I")
# Newest pickle protocol: both ends are the same interpreter, so there is nothing to negotiate.
PICKLE_PROTOCOL = pickle.HIGHEST_PROTOCOL

# Status of a child -> parent frame.
STATUS_OK = 0  # the task returned; the value follows
STATUS_TASK_FAILED = 1  # the task raised (or its return value cannot be pickled)
STATUS_BAD_ARGS = 2  # the child could not unpickle the args
STATUS_UNKNOWN_TASK = 3  # no task of that name in the module
STATUS_READY = 4  # startup hello; the task names follow
STATUS_IMPORT_FAILED = 5  # startup failed importing the task module; the child then exits
STATUS_PROGRESS = 6  # the running task called progress(); (fraction, note) follows

Task = Callable[[Any], Any]


def encode_frame(message: object) -> bytes:
    """Pickle `message` and prefix its length. Raises whatever pickle raises."""
    body = pickle.dumps(message, protocol=PICKLE_PROTOCOL)
    return FRAME_HEADER.pack(len(body)) + body


def read_frame(stream: BinaryIO) -> Any | None:
    """Read one frame from a blocking stream; None at a clean end of stream."""
    header = stream.read(FRAME_HEADER.size)
    if len(header) < FRAME_HEADER.size:
        return None
    (size,) = FRAME_HEADER.unpack(header)
    body = stream.read(size)
    if len(body) < size:
        return None
    return pickle.loads(body)


def task_functions(module: types.ModuleType) -> dict[str, Task]:
    """The tasks of a task module: its public functions defined in that module itself.

    Functions it merely imports (`from hashlib import sha256`) are not tasks.
    """
    return {
        name: value
        for name, value in vars(module).items()
        if isinstance(value, types.FunctionType)
        and value.__module__ == module.__name__
        and not name.startswith("_")
    }


def call_task(fn: Task, args: Any, spread: bool = False) -> Any:
    """Call a task as `fn(args)`, or as `fn(*positional, **keywords)` when `spread` (`args` is
    then that pair: the task was called as itself); an `async def` task is run to completion
    on a fresh loop."""
    result = fn(*args[0], **args[1]) if spread else fn(args)
    if isinstance(result, types.CoroutineType):
        import asyncio  # only async tasks pay for importing asyncio

        return asyncio.run(result)
    return result


def _error(exc: BaseException) -> tuple[str, str]:
    return type(exc).__name__, str(exc)


def _answer(
    tasks: dict[str, Task], task_id: int, name: str, args_pickle: bytes, spread: bool
) -> bytes:
    fn = tasks.get(name)
    if fn is None:
        return encode_frame((task_id, STATUS_UNKNOWN_TASK, ("LookupError", f"no task {name!r}")))
    try:
        args = pickle.loads(args_pickle)
    except Exception as exc:
        return encode_frame((task_id, STATUS_BAD_ARGS, _error(exc)))
    try:
        reply = (task_id, STATUS_OK, call_task(fn, args, spread))
    except Exception as exc:
        # A task's own failure goes back to its caller; the child lives on for the next task.
        reply = (task_id, STATUS_TASK_FAILED, _error(exc))
    try:
        return encode_frame(reply)
    except Exception as exc:
        message = f"the return value of {name} cannot be pickled: {exc}"
        return encode_frame((task_id, STATUS_TASK_FAILED, (type(exc).__name__, message)))


class _ProgressFrames:
    """Writes the running task's progress frames to the parent (behind a ProgressReporter)."""

    def __init__(self, out: BinaryIO) -> None:
        self.out = out
        self.task_id = 0  # the task running now; set before each task

    def send(self, fraction: float, note: str | None) -> None:
        self.out.write(encode_frame((self.task_id, STATUS_PROGRESS, (fraction, note))))
        self.out.flush()


# How much nicer than its parent a pool child runs (0..19; higher yields more).
CHILD_NICENESS = 10


def main(argv: list[str]) -> int:
    """Serve tasks of the module named in argv[1] over stdin/stdout until stdin closes."""
    if len(argv) != 2:
        print("usage: python -P mega/workers/child.py <dotted.task.module>", file=sys.stderr)
        return 2
    # Ctrl-C in a terminal reaches the whole process group; the parent decides when we stop
    # (it closes our stdin), so a keyboard interrupt must not print a traceback per child.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # Below the web process in the scheduler's eyes: when every core is busy hashing, the event
    # loop that answers requests still gets the CPU first (the target: heartbeat p99 within 1.5x
    # the idle p99). Niced, not SCHED_IDLE: an idle-class child runs only on a core nothing else
    # wants, so any busy process beside it (another host, a database) starved the pool until
    # its runs timed out; a niced child keeps a share of the cores, and the heartbeat held as
    # well (1.3x and 1.9x niced, 2.0x and 2.0x idle-class, on two cores).
    with contextlib.suppress(OSError):
        os.nice(CHILD_NICENESS)
    # Keep private copies of the protocol pipes, then point fds 0 and 1 elsewhere: a task that
    # print()s (or reads stdin) must not corrupt a frame. Its prints go to our stderr.
    protocol_in = os.fdopen(os.dup(0), "rb")
    protocol_out = os.fdopen(os.dup(1), "wb")
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    os.dup2(2, 1)
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]

    try:
        module = importlib.import_module(argv[1])
    except Exception as exc:
        traceback.print_exc()
        protocol_out.write(encode_frame((0, STATUS_IMPORT_FAILED, _error(exc))))
        protocol_out.flush()
        return 1
    tasks = task_functions(module)
    frames = _ProgressFrames(protocol_out)
    reporter = task_progress.ProgressReporter(frames.send)
    protocol_out.write(encode_frame((0, STATUS_READY, sorted(tasks))))
    protocol_out.flush()

    while (frame := read_frame(protocol_in)) is not None:
        task_id, name, args_pickle, reporting, spread = frame
        frames.task_id = task_id
        task_progress.install(reporter if reporting else None)
        answer = _answer(tasks, task_id, name, args_pickle, spread)
        # A task that never reported costs this one attribute read, nothing more.
        if reporter.used:
            reporter.finish()  # the held figure goes out before the answer
        protocol_out.write(answer)
        protocol_out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
