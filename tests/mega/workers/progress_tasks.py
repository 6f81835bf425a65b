"""Tasks for tests/mega/workers/test_progress.py: some report progress, one does not."""

from __future__ import annotations

import time
from typing import Any

from mega.workers import progress


def count_up(args: dict[str, int]) -> dict[str, int]:
    """Report i/steps after each of `steps` sleeps of `sleep_ms`, then return the count."""
    steps = args["steps"]
    for done in range(1, steps + 1):
        time.sleep(args["sleep_ms"] / 1000)
        progress(done / steps, f"{done} of {steps}")
    return {"steps": steps}


def tight(args: int) -> int:
    """Report `args` times in a tight loop: the throttle must keep the pipe quiet."""
    for done in range(1, args + 1):
        progress(done / args, "done" if done == args else None)
    return args


def bad_fraction(args: Any) -> None:
    progress(args)


def silent(args: Any) -> Any:
    return args
