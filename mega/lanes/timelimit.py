"""A lane's `timeout_s` as the innermost middleware of its runs: past it the run is cancelled
(again and again, should it swallow a cancel: `mega.tasks.TimeLimit`) and the attempt fails
as `JobTimeout`, which the lane retries or dead-letters like any failure. A run's own
`TimeoutError` passes through as it is. A lane without a limit has no such middleware."""

from __future__ import annotations

from typing import Any

from mega.errors import JobTimeout
from mega.lanes.middleware import CallNext, Run
from mega.tasks import TimeLimit


class TimeLimited:
    """The middleware of a lane whose runs may take `timeout_s` seconds at most."""

    __slots__ = ("timeout_s",)

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s

    async def __call__(self, run: Run, call_next: CallNext) -> Any:
        limit = TimeLimit(self.timeout_s)
        try:
            async with limit:
                return await call_next(run)
        except TimeoutError:
            if not limit.expired():
                raise  # the run's own TimeoutError, not the limit's
            raise JobTimeout(
                f"the run took longer than its timeout_s ({self.timeout_s:g} s) and was cancelled"
            ) from None
