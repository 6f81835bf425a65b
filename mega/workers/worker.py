"""Worker: the declaration of a CPU pool that runs the functions of a task module off the loop.

Not to be confused with JobWorker (which consumes queued jobs): a Worker runs CPU-heavy
functions in child processes (or threads) so `await ctx.workers["hash"].run(...)` never blocks
the loop that serves HTTP.

This module holds what a user declares and its validation (`Worker`, `WorkerSettings`); the
runtime that starts the children and dispatches tasks is `mega.workers.pool.WorkerPool`.
"""

from __future__ import annotations

import importlib
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from mega.errors import RegistrationError
from mega.validation import int_problem
from mega.workers.child import Task, task_functions

MODES = ("process", "thread")
DEFAULT_MAX_RESTARTS = 5  # crash replacements for the whole pool before it is declared broken
QUEUE_SLOTS_PER_WORKER = 4  # default max_queue is this many waiting tasks per pool slot


@dataclass(frozen=True)
class WorkerSettings:
    """A validated Worker declaration; `module` is the dotted task module."""

    name: str
    module: str
    root: Path
    mode: str
    pool_size: int
    max_restarts: int
    max_queue: int
    task_names: frozenset[str]


class Worker:
    """Declare a CPU pool by subclassing and setting class attributes::

        class HashWorker(Worker):
            name = "hash"                                   # ctx.workers["hash"]
            task_file = "app/workers/hash_tasks.py"    # or "app.workers.hash_tasks"

    `task_file`'s public top-level functions are the tasks, each called as `fn(args)`.
    `mode` is "process" (default: real parallelism despite the GIL) or "thread".
    `pool_size` defaults to cpu_count - 1 (at least 1); `max_restarts` (default 5) counts crash
    replacements for the whole pool; `max_queue` (default 4 x pool_size) bounds the wait queue.
    """

    name: ClassVar[str] = "Worker"
    task_file: ClassVar[str] = ""
    mode: ClassVar[str] = "process"
    pool_size: ClassVar[int | None] = None
    max_restarts: ClassVar[int] = DEFAULT_MAX_RESTARTS
    max_queue: ClassVar[int | None] = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "name" not in cls.__dict__:
            cls.name = cls.__name__

    @classmethod
    def validate(cls, root: Path | str | None = None) -> WorkerSettings:
        """Check every field and import the task module (`root` defaults to the cwd).

        Raises RegistrationError naming the field at fault.
        """
        where = cls.__name__
        project = Path(root if root is not None else os.getcwd()).resolve()
        if not isinstance(cls.name, str) or not cls.name.strip():
            raise RegistrationError(f"{where}.name: must be a non-empty string")
        if cls.mode not in MODES:
            raise RegistrationError(f"{where}.mode: {cls.mode!r} is not one of {MODES}")
        pool_size = max(1, (os.cpu_count() or 1) - 1) if cls.pool_size is None else cls.pool_size
        _check_int(f"{where}.pool_size", pool_size, minimum=1)
        _check_int(f"{where}.max_restarts", cls.max_restarts, minimum=0)
        max_queue = QUEUE_SLOTS_PER_WORKER * pool_size if cls.max_queue is None else cls.max_queue
        _check_int(f"{where}.max_queue", max_queue, minimum=0)
        module = _module_name(f"{where}.task_file", cls.task_file, project)
        tasks = _import_tasks(f"{where}.task_file", module, project)
        return WorkerSettings(
            name=cls.name,
            module=module,
            root=project,
            mode=cls.mode,
            pool_size=pool_size,
            max_restarts=cls.max_restarts,
            max_queue=max_queue,
            task_names=frozenset(tasks),
        )


def _check_int(field: str, value: object, *, minimum: int) -> None:
    problem = int_problem(value, minimum=minimum)
    if problem:
        raise RegistrationError(f"{field}: {problem}")


def _module_name(field: str, task_file: object, root: Path) -> str:
    if not isinstance(task_file, str) or not task_file:
        raise RegistrationError(f"{field}: required, e.g. 'app/x/tasks.py' or 'app.x.tasks'")
    if task_file.endswith(".py") or "/" in task_file or os.sep in task_file:
        path = (root / task_file).resolve()
        if not path.is_file():
            raise RegistrationError(f"{field}: no such file {path}")
        if not path.is_relative_to(root):
            raise RegistrationError(f"{field}: {path} is outside the project root {root}")
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
    else:
        parts = task_file.split(".")
    if not parts or not all(part.isidentifier() for part in parts):
        raise RegistrationError(f"{field}: {task_file!r} does not name an importable module")
    return ".".join(parts)


def _import_tasks(field: str, module_name: str, root: Path) -> dict[str, Task]:
    # Appended, not prepended: the project root must not shadow installed packages.
    if str(root) not in sys.path:
        sys.path.append(str(root))
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        message = f"{field}: cannot import {module_name!r}: {type(exc).__name__}: {exc}"
        raise RegistrationError(message) from exc
    tasks = task_functions(module)
    if not tasks:
        raise RegistrationError(f"{field}: {module_name!r} defines no public top-level function")
    return tasks
