"""Traces, as a stage of a lane (mega/lanes/stages.py): each attempt in an OpenTelemetry
consumer span, `process <subject>`, from its start to its settle, so that what is logged while
it runs, its `done` line included, carries the span's ids.

- `around`: the attempt inside the span, whose parent is the context the message carries and
  which links to the attempt before when a retry's copy names it (mega/tracing.py).
- `settle`: a run that raised ends its span as an error, with the exception recorded; a retry's
  copy carries this span's context (`mega-previous`) for the next attempt to link to.

Without an SDK in the process it costs one look-up per attempt, and the span is decided at
each attempt, not when the lane starts: a process that sets up its SDK later is traced from
then on.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Any

from mega import tracing
from mega.drivers.base import Delivery
from mega.lanes.stages import Attempt, End, SettleNext


class Traced:
    """Traces the attempts of one lane (see the module)."""

    __slots__ = ("group", "system")

    def __init__(self, *, system: str, group: str | None) -> None:
        """The tracing stage of one lane.

        Args:
            system: the bus's driver (`nats`, `redis`, `postgres`, `memory`), the span's
                `messaging.system`.
            group: the listener group that consumes the lane, None for a job lane.
        """
        self.system = system
        self.group = group

    def around(self, attempt: Attempt) -> Attempt:
        """`attempt` inside a span, when an SDK is set up at the time it runs."""

        def traced(delivery: Delivery, payload: Any) -> Awaitable[None]:
            if tracing.tracer() is None:
                return attempt(delivery, payload)
            return self._spanned(attempt, delivery, payload)

        return traced

    async def _spanned(self, attempt: Attempt, delivery: Delivery, payload: Any) -> None:
        with tracing.processing(
            delivery.subject,
            system=self.system,
            message_id=delivery.id,
            attempt=delivery.attempt,
            headers=delivery.trace,
            group=self.group,
        ):
            await attempt(delivery, payload)

    def settle(self, end: End, call_next: SettleNext) -> Awaitable[None]:
        exc = end.exc
        if exc is not None:
            tracing.failed(exc)
            if end.kind == "retry":
                end.delivery.trace = tracing.retried(end.delivery.trace)
        return call_next(end)
