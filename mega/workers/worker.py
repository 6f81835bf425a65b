"""Worker: the declaration of a CPU pool that runs the functions of a task module off the loop.

Not to be confused with JobRunner (which consumes queued jobs): a Worker runs CPU-heavy
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
from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field, StrictInt, StrictStr, ValidationInfo, field_validator

from mega.declaration import Declaration, NonNegativeInt, rule, validate_declaration
from mega.errors import RegistrationError
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
        """Check every field and import the task module.

        Raises RegistrationError naming each field at fault.

        Args:
            root: the project root: a `task_file` path is read from it and must lie inside
                it, and it is added to the end of `sys.path` for the import. None is the
                current directory.
        """
        where = cls.__name__
        project = Path(root if root is not None else os.getcwd()).resolve()
        worker = validate_declaration(
            WorkerDeclaration, cls, "", {"root": project}, field_prefix=f"{where}."
        )
        pool_size = worker.pool_size or max(1, (os.cpu_count() or 1) - 1)
        max_queue = (
            QUEUE_SLOTS_PER_WORKER * pool_size if worker.max_queue is None else worker.max_queue
        )
        tasks = _import_tasks(f"{where}.task_file", worker.task_file, project)
        return WorkerSettings(
            name=worker.name,
            module=worker.task_file,
            root=project,
            mode=worker.mode,
            pool_size=pool_size,
            max_restarts=worker.max_restarts,
            max_queue=max_queue,
            task_names=frozenset(tasks),
        )


class WorkerDeclaration(Declaration):
    """The class attributes of a Worker, in the order its problems are reported; `task_file`
    comes out as the dotted name of the task module (the root is in the validation context)."""

    name: Annotated[StrictStr, Field(pattern=r"\S"), rule("must be a non-empty string")]
    mode: Annotated[Literal["process", "thread"], rule(f"must be one of {MODES}")]
    pool_size: Annotated[Annotated[StrictInt, Field(ge=1)] | None, rule("must be a positive int")]
    max_restarts: NonNegativeInt
    max_queue: Annotated[Annotated[StrictInt, Field(ge=0)] | None, rule("must be an int >= 0")]
    task_file: str

    @field_validator("task_file", mode="before")
    @classmethod
    def _module(cls, task_file: object, info: ValidationInfo) -> str:
        return _module_name(task_file, (info.context or {})["root"])


def _module_name(task_file: object, root: Path) -> str:
    if not isinstance(task_file, str) or not task_file:
        raise ValueError("required, e.g. 'app/x/tasks.py' or 'app.x.tasks'")
    if task_file.endswith(".py") or "/" in task_file or os.sep in task_file:
        path = (root / task_file).resolve()
        if not path.is_file():
            raise ValueError(f"no such file {path}")
        if not path.is_relative_to(root):
            raise ValueError(f"{path} is outside the project root {root}")
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
    else:
        parts = task_file.split(".")
    if not parts or not all(part.isidentifier() for part in parts):
        raise ValueError(f"{task_file!r} does not name an importable module")
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
