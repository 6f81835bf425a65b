"""A run's stages: what a capability of a lane does when a delivery starts to run and around
its settle, each in a module of its own, so that the executor (mega/lanes/executor.py) holds a
branch of none of them.

    class Stage:
        def around(self, attempt: Attempt) -> Attempt: ...                     # if it has one
        def begin(self, delivery, started_ms) -> Awaitable[None] | None: ...   # if it has one
        def settle(self, end: End, call_next: SettleNext) -> Awaitable[None]: ...

The run goes through the run's middlewares (mega/lanes/middleware.py); what it came to is an
`End`: `done` (with its result), `cancelled`, a `retry` (its error, when it is due), `dead` (a
dead letter, its record) or `back` (handed back, to be delivered again after `delay_s`). The
stages see it outermost first, as a middleware sees a run: each does its part and hands the
End on with `call_next(end)`, the innermost being the settle on the bus and its signal. A stage
may pass on another End (a workflow's step whose workflow cannot be told is handed back, not
acked), or take the ack into its own hands (`end.after(end, ack)`: the status record,
written and stored, then the ack), which the innermost then calls instead of acking. What the
innermost raises (a dead letter's store that failed) goes back out through them: a stage's
work after `call_next` is then not done.

Every job's settle walks them, so a stage with nothing to wait for returns `call_next(end)`
itself, unawaited (a plain `def`), and costs no coroutine of its own; `begin` likewise returns
an awaitable only when there is something to wait for.

A stage with an `around` wraps each whole attempt, from its start to its settle (the trace's
span, `mega/lanes/traced.py`: what is logged meanwhile carries its ids). A stage with a
`chained(head)` is told the head of the chain it is in, to hand another End through every
stage from the outermost (a step handed back goes after its status records, as any
hand-back does), not only through those within it.

A job lane's stages, outermost first: its traces (`mega/lanes/traced.py`), the job's status
record (`mega/lanes/recorded.py`), then the end of a workflow's step (`mega/lanes/steps.py`).
So a failure's record is stored before its workflow is told, and a done step's workflow is
told before its record says `done` (written at the ack). A listener group's lane has its
traces only.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Literal, Protocol

from mega.drivers.base import Delivery, DlqRecord
from mega.lanes.records import ErrorInfo

Kind = Literal["done", "cancelled", "retry", "dead", "back"]
# What `end.after` is given: the ack, to call once a stage's own work is stored.
Settle = Callable[[Delivery], Awaitable[None]]
# `end.after(end, ack)`: a stage's work, then the ack; an awaitable when it must be awaited.


class End:
    """How one delivery's run ended, as the stages see it before its settle.

    `started` is when the run started (epoch s; None: it never ran) and `started_ms` the same
    in milliseconds, `attempts` the runs its record counts, `result` what a `done` run
    returned, `error` why a `retry` or `dead` one failed (and `exc`, the exception, when its
    run raised it), `due_ms` when a retry is due,
    `record` a dead letter's DLQ record and `terminate` whether its message is terminated
    (never delivered again), `delay_s` how long a `back` waits. `after`, when a stage set it,
    is called as `after(end, ack)` instead of acking: the stage's own work, then the ack (an
    awaitable to await, or None when it took it)."""

    __slots__ = (
        "after",
        "attempts",
        "delay_s",
        "delivery",
        "due_ms",
        "error",
        "exc",
        "kind",
        "record",
        "result",
        "started",
        "started_ms",
        "terminate",
    )

    def __init__(
        self,
        kind: Kind,
        delivery: Delivery,
        started: float | None,
        *,
        attempts: int | None = None,
        result: Any = None,
        error: ErrorInfo | None = None,
        exc: BaseException | None = None,
        due_ms: int = 0,
        record: DlqRecord | None = None,
        terminate: bool = False,
        delay_s: float = 0.0,
    ) -> None:
        self.kind = kind
        self.delivery = delivery
        self.started = started
        self.started_ms = None if started is None else int(started * 1000)
        self.attempts = delivery.attempt if attempts is None else attempts
        self.result = result
        self.error = error
        self.exc = exc
        self.due_ms = due_ms
        self.record = record
        self.terminate = terminate
        self.delay_s = delay_s
        self.after: Callable[[End, Settle], Awaitable[None] | None] | None = None

    def handed_back(self, delay_s: float) -> End:
        """This delivery, handed back to be delivered again after `delay_s`."""
        return End("back", self.delivery, self.started, attempts=self.attempts, delay_s=delay_s)

    def __repr__(self) -> str:
        return f"End({self.kind}, id={self.delivery.id!r}, attempts={self.attempts})"


SettleNext = Callable[[End], Awaitable[None]]
# One attempt of a decoded delivery, from its start to its settle: (delivery, payload).
Attempt = Callable[[Delivery, Any], Awaitable[None]]
# A stage's `begin(delivery, started_ms)`, before the run: an awaitable when it must be waited
# for, else None.
Begin = Callable[[Delivery, int], Awaitable[None] | None]


class Stage(Protocol):
    """A capability on a run's path: `settle` around each settle, and (when it has them)
    `begin(delivery, started_ms)` before each run and `around(attempt)` around each attempt."""

    def settle(self, end: End, call_next: SettleNext) -> Awaitable[None]: ...


def beginnings(stages: Sequence[Stage]) -> tuple[Begin, ...]:
    """The `begin` of each stage that has one, in order."""
    found = (getattr(stage, "begin", None) for stage in stages)
    return tuple(begin for begin in found if begin is not None)


def around(stages: Sequence[Stage], attempt: Attempt) -> Attempt:
    """`attempt` wrapped by the `around` of each stage that has one, the first the outermost."""
    for stage in reversed(stages):
        wrap = getattr(stage, "around", None)
        if wrap is not None:
            attempt = wrap(attempt)
    return attempt


def chain(stages: Sequence[Stage], innermost: SettleNext) -> SettleNext:
    """`innermost` (the settle on the bus) wrapped in `stages`, the first the outermost. Built
    once per lane: a settle walks it with one call per stage, nothing built."""
    call = innermost
    for stage in reversed(stages):
        call = _Link(stage.settle, call)
    for stage in stages:
        told = getattr(stage, "chained", None)
        if told is not None:
            told(call)
    return call


class _Link:
    """One stage of a chain, with the rest of it: called, it calls the stage (which returns
    the awaitable of its settle, or of the rest's)."""

    __slots__ = ("call_next", "settle")

    def __init__(
        self, settle: Callable[[End, SettleNext], Awaitable[None]], call_next: SettleNext
    ) -> None:
        self.settle = settle
        self.call_next = call_next

    def __call__(self, end: End) -> Awaitable[None]:
        return self.settle(end, self.call_next)
