"""Tasks for tests/mega/workers/test_worker.py. Every public top-level function here is a task."""

from __future__ import annotations

import os
import time
from os.path import exists  # imported, so not a task
from typing import Any

BLOCK_LIMIT_S = 10.0  # a blocked task gives up after this, so a failing test cannot hang a child


def echo(args: Any) -> Any:
    return args


def add(args: dict[str, int]) -> int:
    return args["a"] + args["b"]


async def double(args: int) -> int:
    return args * 2


def weigh(parcel: str, rate: int, *, express: bool = False) -> dict[str, int]:
    """A task called as itself: pool.run(weigh, "box", 3, express=True)."""
    return {"cost": len(parcel) * rate * (2 if express else 1)}


def boom(args: Any) -> None:
    raise ValueError("bad")


def pid(args: Any) -> int:
    return os.getpid()


def sleep_ms(args: int) -> int:
    time.sleep(args / 1000)
    return args


def block(args: str) -> str:
    """Hold the slot until the file `args` exists (the test creates it to release us)."""
    deadline = time.monotonic() + BLOCK_LIMIT_S
    while not exists(args) and time.monotonic() < deadline:
        time.sleep(0.005)
    return args


def touch(args: str) -> str:
    with open(args, "w") as file:
        file.write("ran")
    return args


def noisy(args: Any) -> Any:
    print("noise from a task", flush=True)
    return args


def exit_now(args: Any) -> None:
    os._exit(3)


def unpicklable_result(args: Any) -> Any:
    return lambda: None


def _helper(args: Any) -> None:
    """Private: not a task."""
