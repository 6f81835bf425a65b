"""One delivery, from its body to its settle: the decode, the run through the lane's
middlewares (mega/lanes/middleware.py) within its time limit, the decision for its outcome
(`delivery.decide`, pure and table-tested), and the settle that follows it through the lane's
stages (mega/lanes/stages.py: its trace's span around it all, a workflow's step, the status
record), in this order:

1. Each stage's part before the settle: a workflow told that its step ended
   (mega/lanes/steps.py), the job's status record stored (mega/lanes/recorded.py). A worker
   killed in between leaves a job that runs again, never a settled job whose record says
   `running`.
2. The settle: ack (done, cancelled), retry at the backoff's end, or the dead letter stored and
   only then the delivery settled (mega/lanes/dlq_writer.py: a dead letter whose store fails
   is remembered and the delivery handed back, so the redelivery writes it with the real
   error).
3. The signal (`start`, `done`, `retry`, `fail`, `dlq`, `cancel`) once it happened.

A delivery past `retries + 1` attempts is the last one never reporting back (its run killed the
worker): it is dead-lettered as `WorkerCrashed` unless its record says it finished. The consume
loop (mega/lanes/consumer.py) fetches, gates and starts deliveries; this runs each one.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Literal, Protocol

from mega import clock
from mega.drivers.base import Delivery, Receiver
from mega.errors import Permanent
from mega.lanes import dlq_writer
from mega.lanes import stages as settle_stages
from mega.lanes.control import LaneControl
from mega.lanes.delivery import (
    LanePolicy,
    Outcome,
    Retry,
    decide,
    stand_in_id,
)
from mega.lanes.dlq_writer import MAX_ERROR_CHARS, DlqWriter
from mega.lanes.middleware import Middleware, Run, chain
from mega.lanes.records import RUNNING, ErrorInfo, Running
from mega.lanes.stages import End, Stage
from mega.lanes.status import StatusWriter
from mega.lanes.timelimit import TimeLimited
from mega.validation import is_token

# The queue's logger: to an operator, the consume loop is part of the job queue.
logger = logging.getLogger("mega.jobqueue")

# A job cut off by the drain timeout is handed back to be delivered again after this long.
HAND_BACK_DELAY_S = 1.0
# An exhausted job whose DLQ record cannot be stored comes back after this long to try again.
DLQ_RETRY_DELAY_S = 5.0

# Runs one decoded delivery: (payload, delivery); what it returns is the run's result. Raising
# fails the attempt.
Handler = Callable[[Any, Delivery], Awaitable[Any]]
Signal = Callable[..., Awaitable[None]]


class Loop(Protocol):
    """What a run asks of the consume loop that started it."""

    async def held(self, delivery: Delivery) -> bool:
        """Hold the delivery while its lane is paused; True when a stop handed it back."""
        ...

    def cancelled_run(self) -> bool:
        """Whether the run of the current task was cancelled because its job was."""
        ...


class NoLoop:
    """The loop of an executor no consume loop runs (a test's): nothing is held or cancelled."""

    async def held(self, delivery: Delivery) -> bool:
        return False

    def cancelled_run(self) -> bool:
        return False


class Executor:
    """Runs the deliveries of one lane in this process (see the module).

    `spec` says how (its name in signals, retries, backoff, time limit, permanent errors),
    `handler` runs one decoded delivery, `signal(name, **fields)` reports every step (fields
    name the lane `job`), `instance_id` names this process in DLQ records, `records` (a job
    lane's) answers whether a redelivered job ended before, `control` reads its pause,
    `stages` act around each attempt and its settle (mega/lanes/stages.py, the first
    outermost), `middlewares` wrap each run (the first outermost). `group` (a listener
    group's, None for a job lane) names each run in records. `observed(name)` says whether
    anything observes a signal: a `start` or a `done`, which nearly every run sends, is built
    only then. `loop` is the consume loop that runs it, which sets itself there
    (mega/lanes/consumer.py).
    """

    def __init__(
        self,
        receiver: Receiver,
        spec: LanePolicy,
        handler: Handler,
        signal: Signal,
        *,
        instance_id: str,
        group: str | None,
        dlq_retry_delay_s: float = DLQ_RETRY_DELAY_S,
        records: StatusWriter | None = None,
        control: LaneControl | None = None,
        stages: Sequence[Stage] = (),
        middlewares: Sequence[Middleware] = (),
        observed: Callable[[str], bool] = lambda name: True,
    ) -> None:
        self.loop: Loop = NoLoop()
        self.receiver = receiver
        self.spec = spec
        self.handler = handler
        self.signal = signal
        self.observed = observed
        # Runs started and runs done here: counted whether or not a signal is sent for them
        # (a worker host's summary line reads them, mega/runtime/logs.py).
        self.runs_started = 0
        self.runs_done = 0
        self.instance_id = instance_id
        self.group = group
        self.kind: Literal["event", "job"] = "job" if group is None else "event"
        self.dlq_retry_delay_s = dlq_retry_delay_s
        self.records = records
        self.control = control
        self.beginnings = settle_stages.beginnings(stages)
        self.attempt = settle_stages.around(stages, self._attempt)
        self.max_attempts = spec.max_attempts
        self.dead = DlqWriter(spec, signal, instance_id=instance_id, delay_s=dlq_retry_delay_s)
        # The run's pipeline (mega/lanes/middleware.py), built once: the config's middlewares,
        # then the lane's time limit when it has one; None: the run alone.
        limit = [] if spec.timeout_s is None else [TimeLimited(spec.timeout_s)]
        pipeline = [*middlewares, *limit]
        self.pipeline = chain(pipeline, self._innermost) if pipeline else None
        # The settle through the stages (mega/lanes/stages.py), built once likewise.
        self.settle = settle_stages.chain(stages, self._settle)

    async def process(self, delivery: Delivery) -> None:
        spec, attempt = self.spec, delivery.attempt
        try:
            # Decoded first: json.loads of bytes would look for a UTF-16 or -32 encoding, and
            # a body is UTF-8 (bad UTF-8 is a ValueError too).
            payload = json.loads(delivery.body.decode())
        except ValueError as exc:
            await self.signal(
                "fail",
                job=spec.name,
                id=delivery.id,
                attempt=attempt,
                phase="decode",
                error_type="DecodeError",
                error=str(exc),
            )
            record = self.dead.record(
                delivery, None, "DecodeError", str(exc), attempt, delivery.body
            )
            await self.dead.letter(
                self.settle, decide(Outcome.UNDECODABLE, attempt, spec), delivery, record
            )
            return
        if attempt > self.max_attempts:
            await self._unreported(delivery, payload)
            return
        if attempt > 1 and await self._finished(delivery):
            return
        if self.control is not None and self.control.paused and await self.loop.held(delivery):
            return
        RUNNING.set(Running(self.kind, delivery.subject, delivery.id, self.group))
        await self.attempt(delivery, payload)

    async def refuse(self, delivery: Delivery, why: str) -> None:
        """Dead-letter, unrun and under a stand-in id, a delivery whose id or key no engine
        could be trusted to key (mega/lanes/delivery.py, INVALID), without its key: the lane
        goes on."""
        if not is_token(delivery.id):
            delivery.id = stand_in_id(delivery.id)
        delivery.flow_key = None
        try:
            payload = json.loads(delivery.body)
        except ValueError:
            payload = None
        await self.signal(
            "fail",
            job=self.spec.name,
            id=delivery.id,
            attempt=0,
            phase="receive",
            error_type="InvalidId",
            error=why,
        )
        raw = delivery.body if payload is None else None
        record = self.dead.record(delivery, payload, "InvalidId", why, 0, raw)
        await self.dead.letter(self.settle, decide(Outcome.INVALID, 0, self.spec), delivery, record)

    async def _finished(self, delivery: Delivery) -> bool:
        """Whether the job's record says a run before this delivery ended it (done or
        cancelled): then this delivery is acked, not run (again) nor dead-lettered. Read only
        for a delivery after the first, whose earlier run may have ended without its ack."""
        if self.records is None or not self.records.on:
            return False
        ended = await self.records.ended_before(delivery)
        if ended is not None:
            logger.info(
                "%s: %s came back after its attempt %d ended %s (its ack was lost): settled, "
                "not run again",
                self.spec.name,
                delivery.id,
                delivery.attempt - 1,
                ended,
            )
            await self.receiver.ack(delivery)
            return True
        return False

    async def _attempt(self, delivery: Delivery, payload: Any) -> None:
        """One run of a decoded delivery: the start, the handler, its outcome."""
        spec, attempt = self.spec, delivery.attempt
        started = time.time()
        started_ms = int(started * 1000)
        self.runs_started += 1
        if self.observed("start"):  # every run starts: built only when something listens
            due_ms = delivery.run_at_ms or delivery.enqueued_at_ms
            await self.signal(
                "start",
                job=spec.name,
                id=delivery.id,
                attempt=attempt,
                latency_ms=None if due_ms is None else max(0, started_ms - due_ms),
            )
        for begin in self.beginnings:
            waiting = begin(delivery, started_ms)
            if waiting is not None:
                await waiting
        try:
            result = await self._run(payload, delivery)
        except asyncio.CancelledError:
            if self.loop.cancelled_run():  # its job was cancelled: not run again
                await self.skip(delivery, started)
                return
            # Cut off by the drain timeout: hand it back now rather than after the ack wait.
            await self.receiver.release(delivery, delay_s=HAND_BACK_DELAY_S)
            raise
        except Exception as exc:
            await self._failed(delivery, payload, started, exc)
            return
        await self.settle(End("done", delivery, started, result=result))

    async def _run(self, payload: Any, delivery: Delivery) -> Any:
        """The run, through the pipeline when there is one."""
        if self.pipeline is None:
            return await self.handler(payload, delivery)
        return await self.pipeline(Run(self.spec.name, self.kind, payload, delivery))

    async def _innermost(self, run: Run) -> Any:
        return await self.handler(run.payload, run.delivery)

    async def _failed(
        self, delivery: Delivery, payload: Any, started: float, exc: Exception
    ) -> None:
        spec, attempt = self.spec, delivery.attempt
        error_type, error = type(exc).__name__, str(exc)[:MAX_ERROR_CHARS]
        fields = {"job": spec.name, "id": delivery.id, "attempt": attempt}
        fields["duration_ms"] = _ms_since(started)
        permanent = isinstance(exc, (Permanent, *spec.permanent))
        decision = decide(Outcome.PERMANENT if permanent else Outcome.FAILED, attempt, spec)
        if isinstance(decision, Retry):
            failure = ErrorInfo(type=error_type, message=error)
            due_ms = clock.now_ms() + decision.delay_ms
            retry = End("retry", delivery, started, error=failure, exc=exc, due_ms=due_ms)
            await self.settle(retry)
            await self.signal(
                "retry",
                **fields,
                delay_ms=decision.delay_ms,
                run_at=due_ms,
                error_type=error_type,
                error=error,
            )
            return
        await self.signal("fail", **fields, phase="run", error_type=error_type, error=error)
        record = self.dead.record(delivery, payload, error_type, error, attempt)
        await self.dead.letter(self.settle, decision, delivery, record, started, exc)

    async def _unreported(self, delivery: Delivery, payload: Any) -> None:
        """A delivery past the last attempt: dead-letter what the last one left behind, unless
        its record says it finished (its ack was lost: a worker killed between the record and
        the ack, a lease that ran out while the record was being stored), which is settled."""
        record = self.dead.remembered(delivery)
        if record is None and await self._finished(delivery):
            return
        if record is None:  # not a DLQ store of ours that failed: a crash
            # This delivery is not an attempt: the signal, like the record, names the last
            # attempt, the one that never reported back.
            runs = delivery.attempt - 1
            message = (
                f"attempt {runs} of {self.spec.max_attempts} never reported back: its worker "
                "died (crash, os._exit, OOM kill) or its DLQ record could not be written"
            )
            record = self.dead.record(delivery, payload, "WorkerCrashed", message, runs)
            await self.signal(
                "fail",
                job=self.spec.name,
                id=delivery.id,
                attempt=runs,
                phase="run",
                error_type="WorkerCrashed",
                error=message,
            )
        await self.dead.letter(
            self.settle, decide(Outcome.UNREPORTED, delivery.attempt, self.spec), delivery, record
        )

    async def skip(self, delivery: Delivery, started: float | None = None) -> None:
        """Settle a cancelled job's delivery without running it (again): its record counts
        the runs made, this delivery's only when it was running (`started`)."""
        runs = delivery.attempt if started is not None else delivery.attempt - 1
        await self.settle(End("cancelled", delivery, started, attempts=runs))

    # -- the settle on the bus, inside the stages ---------------------------------------------

    async def _settle(self, end: End) -> None:
        """Settle the delivery as `end` says, and signal a `done` or a `cancel` (a retry is
        signalled by `_failed`, a dead letter by the DlqWriter, once the stages are through)."""
        delivery, kind, spec = end.delivery, end.kind, self.spec
        if kind in ("done", "cancelled"):
            ack = self.receiver.ack
            # A stage's work first (the status record, stored), then the ack.
            waiting = ack(delivery) if end.after is None else end.after(end, ack)
            if waiting is not None:
                await waiting
            if kind == "done":
                self.runs_done += 1
                if not self.observed("done"):  # as `start`: most jobs end done
                    return
                await self.signal(
                    "done",
                    job=spec.name,
                    id=delivery.id,
                    attempt=delivery.attempt,
                    duration_ms=_ms_since(end.started),
                )
            else:
                await self.signal(
                    "cancel",
                    job=spec.name,
                    id=delivery.id,
                    attempt=delivery.attempt,
                    running=end.started is not None,
                )
        elif kind == "retry":  # signalled by `_failed`, with its decision
            await self.receiver.retry(delivery, due_ms=end.due_ms, attempts=delivery.attempt)
        elif kind == "dead":
            assert end.record is not None
            await dlq_writer.store(self.receiver, delivery, end.record, end.terminate)
        else:
            await self.receiver.release(delivery, delay_s=end.delay_s)


def _ms_since(started: float | None) -> float | None:
    return None if started is None else round((time.time() - started) * 1000, 3)
