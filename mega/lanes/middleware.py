"""A run as a pipeline: the middlewares a lane runs each delivery through, around its `run`.

A middleware is an object (or a function) called as `await middleware(run, call_next)`, the
way Starlette calls an HTTP middleware with `(request, call_next)`: it sees the run before its
`run` starts, calls `await call_next(run)` for the rest of the pipeline, and sees its result,
or the exception it raises, after. What it returns is the run's result; what it raises fails
the attempt (retried, or dead-lettered, as an exception raised by `run` itself).

    class Timing:
        async def __call__(self, run: Run, call_next: CallNext) -> Any:
            started = time.perf_counter()
            try:
                return await call_next(run)
            finally:
                log.info("%s %s took %.3f s", run.name, run.id, time.perf_counter() - started)

    middlewares = [Timing()]    # in the config: every job and every listener group, in order

The first listed is the outermost. The lane's `timeout_s` sits inside them, as a middleware of
its own (mega/lanes/timelimit.py): a middleware sees a run cut off by it as `JobTimeout`.
Calling `call_next` again runs the job again within the same attempt (a middleware's own
retry); not calling it skips the run, and what the middleware returns is the result. Retries,
dead letters, status records, cancels and the ack stay the lane's: a middleware cannot lose a
delivery.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Literal, Protocol

from mega.drivers.base import Delivery


class Run:
    """One delivery's run, as a middleware sees it: its `name`, `kind` and `payload`, and its
    delivery's `id`, `attempt` (1 for the first), `subject` and fair-turn `key` (None
    without)."""

    __slots__ = ("delivery", "kind", "name", "payload")

    def __init__(
        self, name: str, kind: Literal["job", "event"], payload: Any, delivery: Delivery
    ) -> None:
        """One delivery's run, as the lane hands it to its middlewares.

        Args:
            name: the job's name, or the listener group's.
            kind: "job" or "event".
            payload: the decoded JSON, which a middleware may replace before calling
                `call_next`.
            delivery: the delivery being run, which gives the run its id, attempt, subject and
                key.
        """
        self.name = name
        self.kind = kind
        self.payload = payload
        self.delivery = delivery

    @property
    def id(self) -> str:
        return self.delivery.id

    @property
    def attempt(self) -> int:
        return self.delivery.attempt

    @property
    def subject(self) -> str:
        return self.delivery.subject

    @property
    def key(self) -> str | None:
        return self.delivery.flow_key

    def __repr__(self) -> str:
        return f"Run({self.kind} {self.name!r}, id={self.id!r}, attempt={self.attempt})"


CallNext = Callable[[Run], Awaitable[Any]]


class Middleware(Protocol):
    """What the config's `middlewares` list holds: `async def __call__(self, run, call_next)`."""

    def __call__(self, run: Run, call_next: CallNext, /) -> Awaitable[Any]: ...


def chain(middlewares: Sequence[Middleware], innermost: CallNext) -> CallNext:
    """`innermost` wrapped in `middlewares`, the first the outermost. Built once per lane:
    a run walks it without building anything."""
    call = innermost
    for middleware in reversed(middlewares):
        call = _wrapped(middleware, call)
    return call


def _wrapped(middleware: Middleware, call_next: CallNext) -> CallNext:
    async def call(run: Run) -> Any:
        return await middleware(run, call_next)

    return call
