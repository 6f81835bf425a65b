"""WorkerProcess: one child process of a process-mode WorkerPool, and the pipes to it.

`mega.workers.pool.WorkerPool` decides what runs where and when; a WorkerProcess only
starts `python -P mega/workers/child.py <task module>`, writes frames to the child's stdin,
reads its answers from stdout, and closes, waits for or kills it. The frames are
`mega.workers.child`'s.

Its stdout is read on the event loop itself, with `loop.add_reader` on a plain non-blocking
pipe: no StreamReader, no multiprocessing queues, no feeder threads (see PIPE_READ_CHUNK_BYTES).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import pickle
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from mega.errors import WorkerError
from mega.workers.child import FRAME_HEADER, STATUS_PROGRESS, STATUS_READY, STATUS_TASK_FAILED

# Every child runs this file by path with `python -P`, not `python -m mega.workers.child`:
# -m would first import the package `mega`, whose __init__ re-exports the whole framework
# (FastAPI, SQLAlchemy, ...), and each child, replacements included, would pay for it.
# -P keeps the script's own directory off sys.path; PYTHONPATH gives the root instead.
CHILD_SCRIPT = str(Path(__file__).with_name("child.py"))
CHILD_STARTUP_TIMEOUT_S = 30.0  # a child must import its task module within this
# Bytes asked of each read of a child's stdout. Kept under glibc's mmap threshold (128 KiB):
# asyncio's pipe transport reads 256 KiB at a time, and each such read mmaps, mremaps and
# munmaps a fresh buffer (~20 us a read here, against ~2 us at 64 KiB), which alone halved
# the pool's throughput. Hence add_reader on a plain pipe instead of a StreamReader.
PIPE_READ_CHUNK_BYTES = 64 * 1024
# Where `app` lives, so a task module can import the framework whatever the project root is.
FRAMEWORK_ROOT = str(Path(__file__).resolve().parents[2])

# Called with (status, value) for each answer frame after the hello, on the event loop.
FrameHandler = Callable[[int, Any], None]
# Called with (fraction, note) for each progress frame of the running task, on the event loop.
ProgressHandler = Callable[[Any], None]


def child_env(root: Path) -> dict[str, str]:
    """This process's environment, with PYTHONPATH led by `root` and then the framework's root."""
    pythonpath = [str(root), FRAMEWORK_ROOT, os.environ.get("PYTHONPATH", "")]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, pythonpath))}


class WorkerProcess:
    """One started child: `send()` frames to it, get its answers through `on_frame`.

    Create with `await WorkerProcess.start(...)`. The child runs one frame at a time; the caller
    keeps track of which task each answer (and each progress frame) belongs to. When the
    child's stdout closes (it exited, or was killed), `stdout_closed()` returns; `wait()` then
    gives its exit code.
    """

    def __init__(
        self,
        proc: asyncio.subprocess.Process,
        fd: int,
        on_frame: FrameHandler,
        on_progress: ProgressHandler,
    ) -> None:
        loop = asyncio.get_running_loop()
        self._proc = proc
        assert proc.stdin is not None
        self._stdin = proc.stdin
        self._fd = fd  # non-blocking read end of the child's stdout; -1 once closed
        self._inbox = bytearray()  # bytes of a frame not yet whole
        self._on_frame = on_frame
        self._on_progress = on_progress
        self._hello: asyncio.Future[tuple[Any, Any]] = loop.create_future()
        self._eof: asyncio.Future[None] = loop.create_future()
        loop.add_reader(fd, self._on_readable)

    @classmethod
    async def start(
        cls,
        module: str,
        *,
        root: Path,
        env: Mapping[str, str],
        on_frame: FrameHandler,
        on_progress: ProgressHandler,
        pool: str,
    ) -> WorkerProcess:
        """Start a child for the dotted task `module` (cwd `root`) and wait up to
        CHILD_STARTUP_TIMEOUT_S for its hello. Answers go to `on_frame(status, value)`, progress
        frames to `on_progress((fraction, note))`. `pool` names the pool in error messages.

        Raises WorkerError(worker.crashed) if it cannot start, exits or fails its import first.
        """
        read_fd, write_fd = os.pipe()
        try:
            proc = await asyncio.create_subprocess_exec(
                *(sys.executable, "-P", CHILD_SCRIPT, module),
                stdin=asyncio.subprocess.PIPE,
                stdout=write_fd,
                cwd=root,
                env=env,
            )
        except OSError as exc:
            os.close(read_fd)
            message = f"pool {pool} cannot start a worker process: {exc}"
            raise WorkerError(message, code="worker.crashed") from exc
        finally:
            os.close(write_fd)  # the child holds the only write end now: its exit is our EOF
        os.set_blocking(read_fd, False)
        child = cls(proc, read_fd, on_frame, on_progress)
        try:
            async with asyncio.timeout(CHILD_STARTUP_TIMEOUT_S):
                status, detail = await child._hello
        except TimeoutError:
            status, detail = None, f"no hello within {CHILD_STARTUP_TIMEOUT_S} s"
        if status != STATUS_READY:
            child.kill()
            child._close_pipe()
            code = await proc.wait()
            message = (
                f"a worker process of pool {pool} failed to start "
                f"(exit code {code}, {detail}); its traceback is on stderr"
            )
            raise WorkerError(message, code="worker.crashed")
        return child

    @property
    def pid(self) -> int:
        return self._proc.pid

    @property
    def returncode(self) -> int | None:
        """The exit code once the child has been reaped, else None."""
        return self._proc.returncode

    def send(self, frame: bytes) -> None:
        """Queue an encoded frame on the child's stdin; never blocks."""
        self._stdin.write(frame)

    def close_stdin(self) -> None:
        """Ask the child to exit: its read loop ends at EOF and it exits 0."""
        self._stdin.close()

    def kill(self) -> None:
        """SIGKILL the child; a child already gone is not an error."""
        with contextlib.suppress(ProcessLookupError):
            self._proc.kill()

    async def stdout_closed(self) -> None:
        """Return once the child's stdout has closed, which is when it has exited."""
        await self._eof

    async def wait(self) -> int:
        """Wait for the child to exit and return its exit code."""
        return await self._proc.wait()

    def _on_readable(self) -> None:
        """The child's stdout has bytes: hand on every whole frame they complete."""
        try:
            data = os.read(self._fd, PIPE_READ_CHUNK_BYTES)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self._close_pipe()
            return
        inbox = self._inbox
        inbox += data
        while len(inbox) >= FRAME_HEADER.size:
            (size,) = FRAME_HEADER.unpack_from(inbox)
            end = FRAME_HEADER.size + size
            if len(inbox) < end:
                break
            body = inbox[FRAME_HEADER.size : end]
            del inbox[:end]
            try:
                _, status, value = pickle.loads(body)
            except Exception as exc:
                reason = f"its return value cannot be unpickled here: {exc}"
                status, value = STATUS_TASK_FAILED, (type(exc).__name__, reason)
            if not self._hello.done():
                self._hello.set_result((status, value))
            elif status == STATUS_PROGRESS:
                self._on_progress(value)
            else:
                self._on_frame(status, value)

    def _close_pipe(self) -> None:
        if self._fd >= 0:
            asyncio.get_running_loop().remove_reader(self._fd)
            os.close(self._fd)
            self._fd = -1
        if not self._hello.done():
            self._hello.set_result((None, "it exited before its hello"))
        if not self._eof.done():
            self._eof.set_result(None)
