"""The consume loop: one lane (a job's queue, a listener group) in one process, on any driver.

The driver's `Receiver` hands over deliveries and settles them; everything else is here, once:
the slots (`concurrency` runs at a time), the lease heartbeats, the decision for each outcome
(`delivery.decide`, pure and table-tested), the signals and the DLQ records, and the drain.

- Each delivery runs the moment it arrives, in a task of its own: no waiting for a batch to
  fill, which is what keeps start latency low. The next `fetch` is in flight while the jobs of
  the last one run, so the engine's round trip is hidden behind them.
- Attempts come from the driver (its delivery count plus the attempts a retry's copy carries),
  so they survive a worker crash. A delivery past `retries + 1` means the last attempt never
  reported back (the job killed its worker): it goes to the DLQ as `WorkerCrashed` instead of
  running again.
- A retry is scheduled by the driver for the backoff's end without holding a slot meanwhile.
- A run past the lane's `timeout_s` is cancelled and fails as `JobTimeout`; a run that raises
  `Permanent` (or one of the lane's `permanent` errors) is dead-lettered without its retries.
- Tries exhausted: the DLQ record is stored and only then the delivery settled. If the record
  cannot be stored the delivery is released to come back later, and the record is remembered
  (by the message's key) so the redelivery writes it with the real error: nothing is lost.
- A stop drains: no more fetches, running jobs get up to the timeout, the rest are cancelled
  and handed back.
- Its presence record (presence.py) says every few seconds that it runs, how many deliveries
  run now and how many it settled; at the stop it says stopped.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Coroutine, Hashable
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from mega import tracing
from mega.drivers.base import (
    Delivery,
    DlqRecord,
    DriverUnavailable,
    Lane,
    MessageTooLarge,
    Receiver,
)
from mega.errors import JobTimeout, Permanent
from mega.jobs.control import WATCH_S, LaneControl
from mega.jobs.delivery import (
    DeadLetter,
    Decision,
    LanePolicy,
    Outcome,
    Retry,
    decide,
    refusal,
    stand_in_id,
)
from mega.jobs.dlq import make_record
from mega.jobs.flow import Gate
from mega.jobs.presence import PRESENCE_EVERY_S, Presence
from mega.jobs.status import RUNNING, ErrorInfo, Running, StatusWriter
from mega.jobs.steps import STEP_PREFIX
from mega.tasks import TimeLimit, cancel_and_wait, wait_event
from mega.validation import is_token

# The queue's logger: to an operator, the consume loop is part of the job queue.
logger = logging.getLogger("mega.jobqueue")

# Error messages in signals and DLQ records are cut to this many characters.
MAX_ERROR_CHARS = 2000
# A job cut off by the drain timeout is handed back to be delivered again after this long.
HAND_BACK_DELAY_S = 1.0
# An exhausted job whose DLQ record cannot be stored comes back after this long to try again.
DLQ_RETRY_DELAY_S = 5.0
# DLQ records whose store failed, kept so the redelivery carries the real error.
UNREPORTED_MEMO_SIZE = 1024
# The longest a fetch waits for its cancel read (and never over a quarter of the ack wait):
# an engine in an election must not hold fetched jobs until they are delivered again.
CANCEL_READ_S = 0.5
# How old a read of the cancel window may be when a fetch answers (else it is read again), and
# so how long before its delivery a cancel must have returned to stop a job from starting at
# all; one later is still honoured by the watch, which cancels the run within a second.
WINDOW_FRESH_S = 0.05

# How long a stopping loop waits to mark its presence record stopped.
PRESENCE_STOP_S = 2.0
# How long a stopping loop waits for its helper tasks (heartbeat, watch, presence), and for runs
# cancelled at the end of the drain, to end once cancelled.
LOOPS_STOP_S = 2.0


class StepEnds(Protocol):
    """Where a job lane reports the end of a workflow step (mega/jobs/workflow.py's
    Workflows), before its delivery is settled."""

    async def ended(
        self, job_id: str, state: Literal["done", "dlq", "cancelled"], *, result: Any = None,
        error: ErrorInfo | None = None, attempts: int = 1,
    ) -> None: ...  # fmt: skip


# Runs one decoded delivery: (payload, delivery); what it returns is the run's result. Raising
# fails the attempt.
Handler = Callable[[Any, Delivery], Awaitable[Any]]
Signal = Callable[..., Awaitable[None]]


@dataclass(frozen=True)
class Window:
    """A read of the lane's cancel window, started beside a fetch."""

    read: asyncio.Task[None]
    started_at: float  # monotonic


class Lease:
    """A delivery being run, when its ack wait was last extended (monotonic s), and whether
    its job was cancelled (then its task is cancelled, and the delivery acked)."""

    __slots__ = ("cancelled", "delivery", "extended_at")

    def __init__(self, delivery: Delivery, extended_at: float) -> None:
        self.delivery = delivery
        self.extended_at = extended_at
        self.cancelled = False


class Consumer:
    """One lane's consume loop in this process: `run()` until `request_stop()` has drained it.

    `spec` says how it runs (its name in signals, concurrency, ack wait, retries, backoff),
    `handler` runs one delivery, `signal(name, **fields)` reports every step (fields name the
    lane `job`), `instance_id` names this process in DLQ records, `records` (a job lane's)
    keeps each job's status record and `control` reads its pause and cancels. `lane` and
    `system` (the bus's driver) name each run in traces and as the cause of the jobs it
    enqueues. `steps` hears the end of each job that is a workflow's step (its id says so).
    """

    def __init__(
        self,
        receiver: Receiver,
        spec: LanePolicy,
        handler: Handler,
        signal: Signal,
        *,
        instance_id: str,
        dlq_retry_delay_s: float = DLQ_RETRY_DELAY_S,
        records: StatusWriter | None = None,
        control: LaneControl | None = None,
        lane: Lane | None = None,
        system: str = "",
        presence: Presence | None = None,
        gate: Gate | None = None,
        steps: StepEnds | None = None,
    ) -> None:
        self.receiver = receiver
        self.steps = steps
        self.system = system
        self.group = lane.name if lane is not None and lane.kind == "group" else None
        self.kind: Literal["event", "job"] = "job" if self.group is None else "event"
        self.presence = presence
        self.gate = gate
        self.fetch_cap = gate.fetch_cap if gate is not None else None
        self.stop_requested = asyncio.Event()  # ends a wait for the rate limit at once
        self.settled = 0  # deliveries settled since the start (the presence record's `done`)
        self.records = records
        self.control = control
        self.resumed = asyncio.Event()  # cleared while the lane is paused
        self.resumed.set()
        self.spec = spec
        self.handler = handler
        self.signal = signal
        self.instance_id = instance_id
        self.dlq_retry_delay_s = dlq_retry_delay_s
        self.running: dict[asyncio.Task[None], Lease] = {}
        self.slot_free = asyncio.Event()
        self.stopping = False
        self.drain_timeout_s = 0.0
        self.closed = asyncio.Event()
        self.unreported: OrderedDict[Hashable, DlqRecord] = OrderedDict()
        self.max_attempts = spec.max_attempts
        self.window: Window | None = None  # the latest read of the cancel window
        self.cancels_unread = 0  # fetches started without their cancels read, since a read

    def request_stop(self, timeout_s: float) -> None:
        self.stopping = True
        self.stop_requested.set()
        self.drain_timeout_s = timeout_s
        self.receiver.wake()
        self.slot_free.set()
        self.resumed.set()

    async def run(self) -> None:
        heartbeat = asyncio.create_task(self._heartbeat())
        present = asyncio.create_task(self._present()) if self.presence is not None else None
        watch = None
        if self.control is not None:
            with contextlib.suppress(DriverUnavailable):  # the watch reads it again each second
                await self._refresh()  # a queue paused before this worker started stays so
            watch = asyncio.create_task(self._watch())
        try:
            await self._fetch_loop()
            await self._drain()
        finally:
            await cancel_and_wait([heartbeat, watch, present], LOOPS_STOP_S)
            if present is not None:
                await self._absent()
            for task in self.running:  # left only if run() itself was cancelled
                task.cancel()
            if self.records is not None:
                await self.records.close()
            if self.gate is not None:
                await self.gate.close()
            await self.receiver.close()
            self.closed.set()

    async def _fetch_loop(self) -> None:
        concurrency = self.spec.concurrency
        while not self.stopping:
            free = concurrency - len(self.running)
            if free <= 0:
                self.slot_free.clear()
                await self.slot_free.wait()
                continue
            if self.fetch_cap is not None:  # no more than the rate limit could let start
                free = min(free, self.fetch_cap)
            # The cancel window is read beside the fetch, not after it: no round trip added.
            window = self._read_window()
            deliveries = await self.receiver.fetch(free)
            if deliveries and any(map(refusal, deliveries)):
                deliveries = self._screened(deliveries)
            cancelled = await self._cancelled(deliveries, window)
            if self.gate is not None and deliveries:
                await self._start_gated(deliveries, cancelled)
                continue
            for delivery in deliveries:
                self._start(delivery, cancelled)

    def _screened(self, deliveries: list[Delivery]) -> list[Delivery]:
        """The deliveries that may run; each other is refused in a task of its own."""
        runnable = []
        for delivery in deliveries:
            why = refusal(delivery)
            if why is None:
                runnable.append(delivery)
                continue
            task = asyncio.create_task(self._refuse(delivery, why))
            self.running[task] = Lease(delivery, time.monotonic())
            task.add_done_callback(self._on_done)
        return runnable

    def _start(self, delivery: Delivery, cancelled: set[str] | tuple[()]) -> None:
        process = self._skip(delivery) if delivery.id in cancelled else self._process(delivery)
        if self.gate is not None and delivery.id not in cancelled:
            process = self._gated(process, delivery)
        task = asyncio.create_task(process)
        self.running[task] = Lease(delivery, time.monotonic())
        task.add_done_callback(self._on_done)

    async def _start_gated(
        self, deliveries: list[Delivery], cancelled: set[str] | tuple[()]
    ) -> None:
        """Start what the lane's limits admit of the fetched deliveries (a cancelled one needs
        no grant: it is not run) and hold the rest back as delayed messages, their attempt
        unchanged (see mega/jobs/flow.py). Once the runs began, their rate grants are stamped
        with the time; when the whole group's rate limit held some, the next fetch waits for
        its window."""
        gate = self.gate
        assert gate is not None
        runs = [delivery for delivery in deliveries if delivery.id not in cancelled]
        admission = await gate.admit(runs)
        for delivery in deliveries:
            if delivery.id in cancelled:
                self._start(delivery, cancelled)
        for delivery in admission.start:
            self._start(delivery, cancelled)
        if admission.start:
            await asyncio.sleep(0)  # the runs begin before their grants are stamped
        await gate.started(admission)
        if admission.held:
            await asyncio.gather(*(self._hold(d, due_s) for d, due_s in admission.held))
        if admission.wait_s > 0:
            await wait_event(self.stop_requested, admission.wait_s)

    async def _hold(self, delivery: Delivery, due_s: float) -> None:
        """Back to the queue as a delayed message due in `due_s`, attempt unchanged (a retry of
        `attempt - 1`)."""
        due_ms = int((time.time() + due_s) * 1000)
        await self.receiver.retry(delivery, due_ms=due_ms, attempts=delivery.attempt - 1)

    async def _gated(self, process: Coroutine[Any, Any, None], delivery: Delivery) -> None:
        """Run `process`, then give up the lease its key holds (key_concurrency)."""
        assert self.gate is not None
        try:
            await process
        finally:
            self.gate.ended(delivery)

    def _on_done(self, task: asyncio.Task[None]) -> None:
        self.running.pop(task, None)
        if not task.cancelled():  # a cancelled one was handed back, not settled
            self.settled += 1
        if not task.cancelled() and task.exception() is not None:
            logger.error("%s: job task crashed", self.spec.name, exc_info=task.exception())
        self.slot_free.set()

    # -- running ----------------------------------------------------------------------------

    async def _process(self, delivery: Delivery) -> None:
        spec, attempt = self.spec, delivery.attempt
        try:
            payload = json.loads(delivery.body)
        except ValueError as exc:  # also bad UTF-8
            await self.signal(
                "fail", job=spec.name, id=delivery.id, attempt=attempt, phase="decode",
                error_type="DecodeError", error=str(exc),
            )  # fmt: skip
            record = self._record(delivery, None, "DecodeError", str(exc), attempt, delivery.body)
            await self._dead_letter(decide(Outcome.UNDECODABLE, attempt, spec), delivery, record)
            return
        if attempt > self.max_attempts:
            await self._unreported(delivery, payload)
            return
        if attempt > 1 and await self._finished(delivery):
            return
        if self.control is not None and self.control.paused:
            # Held, its lease renewed, until the queue is resumed; handed back at a stop.
            await self.resumed.wait()
            if self.stopping:
                await self.receiver.release(delivery, delay_s=HAND_BACK_DELAY_S)
                return
        RUNNING.set(Running(self.kind, delivery.subject, delivery.id, self.group))
        if tracing.tracer() is None:
            await self._attempt(delivery, payload)
            return
        with tracing.processing(
            delivery.subject, system=self.system, message_id=delivery.id, attempt=attempt,
            headers=delivery.trace, group=self.group,
        ):  # fmt: skip
            await self._attempt(delivery, payload)

    async def _refuse(self, delivery: Delivery, why: str) -> None:
        """Dead-letter, unrun and under a stand-in id, a delivery whose id or key no engine
        could be trusted to key (mega/jobs/delivery.py, INVALID), without its key: the lane
        goes on."""
        if not is_token(delivery.id):
            delivery.id = stand_in_id(delivery.id)
        delivery.flow_key = None
        try:
            payload = json.loads(delivery.body)
        except ValueError:
            payload = None
        await self.signal(
            "fail", job=self.spec.name, id=delivery.id, attempt=0, phase="receive",
            error_type="InvalidId", error=why,
        )  # fmt: skip
        raw = delivery.body if payload is None else None
        record = self._record(delivery, payload, "InvalidId", why, 0, raw)
        await self._dead_letter(decide(Outcome.INVALID, 0, self.spec), delivery, record)

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
                "not run again", self.spec.name, delivery.id, delivery.attempt - 1, ended,
            )  # fmt: skip
            await self.receiver.ack(delivery)
            return True
        return False

    async def _attempt(self, delivery: Delivery, payload: Any) -> None:
        """One run of a decoded delivery: the start, the handler, its outcome."""
        spec, attempt = self.spec, delivery.attempt
        started = time.time()
        started_ms = int(started * 1000)
        due_ms = delivery.run_at_ms or delivery.enqueued_at_ms
        await self.signal(
            "start", job=spec.name, id=delivery.id, attempt=attempt,
            latency_ms=None if due_ms is None else max(0, started_ms - due_ms),
        )  # fmt: skip
        if self.records is not None:
            self.records.started(delivery, started_ms)
            if attempt > 1:
                # A run after the first may be one that kills its worker again (a crash loop):
                # its record, naming this worker and the attempts before it, is stored before
                # it runs, so that the job's page shows each lost attempt as it happens.
                await self.records.sent()
        try:
            result = await self._run(payload, delivery)
        except asyncio.CancelledError:
            lease = self.running.get(asyncio.current_task())  # type: ignore[arg-type]
            if lease is not None and lease.cancelled:  # its job was cancelled: not run again
                await self._skip(delivery, started_ms)
                return
            # Cut off by the drain timeout: hand it back now rather than after the ack wait.
            await self.receiver.release(delivery, delay_s=HAND_BACK_DELAY_S)
            raise
        except Exception as exc:
            await self._failed(delivery, payload, started, exc)
            return
        if self._is_step(delivery) and not await self._step_ended(delivery, "done", result):
            return
        if self.records is not None:
            self.records.done(delivery, started_ms, result)
        await self._ack_after_records(delivery)
        await self.signal(
            "done", job=spec.name, id=delivery.id, attempt=attempt,
            duration_ms=round((time.time() - started) * 1000, 3),
        )  # fmt: skip

    async def _hand_back(self, delivery: Delivery, delay_s: float) -> None:
        """Give the delivery back to run again after `delay_s`, once this run's records are
        stored."""
        await self._records_stored()
        await self.receiver.release(delivery, delay_s=delay_s)

    async def _records_stored(self) -> None:
        """Wait until this run's status records are stored, before its job is handed back
        or dead-lettered: the next run's records, perhaps another worker's, then come after
        them (a late record of this run would replace theirs), and a worker killed after the
        settle leaves its job's record stored."""
        if self.records is not None:
            await self.records.sent()

    async def _ack_after_records(self, delivery: Delivery) -> None:
        """Ack a job that ended (done, cancelled) once its last record is stored: the status
        writer acks it after the batch that holds the record (sent at once, with the records
        of the jobs that end meanwhile), so the run's task ends now. A worker killed between
        the two leaves a job that runs again, never an acked one whose record says `running`
        for good."""
        if self.records is not None and self.records.on:
            self.records.then(self.receiver.ack, delivery)
        else:
            await self.receiver.ack(delivery)

    def _is_step(self, delivery: Delivery) -> bool:
        """Whether the delivery is a workflow's step (checked inline: no coroutine per job)."""
        return self.steps is not None and delivery.id.startswith(STEP_PREFIX)

    async def _step_ended(
        self, delivery: Delivery, state: Literal["done", "cancelled"], result: Any = None
    ) -> bool:
        """Report a workflow step's end before its delivery is settled; False when the bus
        did not take the report: the delivery is handed back to run (and report) again."""
        assert self.steps is not None
        try:
            await self.steps.ended(delivery.id, state, result=result, attempts=delivery.attempt)
        except DriverUnavailable as exc:
            logger.warning(
                "%s: %s ended %s, and its workflow could not be told (%s): it runs again in "
                "%g s", self.spec.name, delivery.id, state, exc, self.dlq_retry_delay_s,
            )  # fmt: skip
            await self._hand_back(delivery, self.dlq_retry_delay_s)
            return False
        return True

    async def _run(self, payload: Any, delivery: Delivery) -> Any:
        """The handler, within the lane's `timeout_s` when it has one (JobTimeout past it)."""
        timeout_s = self.spec.timeout_s
        if timeout_s is None:
            return await self.handler(payload, delivery)
        limit = TimeLimit(timeout_s)
        try:
            async with limit:
                return await self.handler(payload, delivery)
        except TimeoutError:
            if not limit.expired():
                raise  # the run's own TimeoutError, not the limit's
            raise JobTimeout(
                f"the run took longer than its timeout_s ({timeout_s:g} s) and was cancelled"
            ) from None

    async def _failed(
        self, delivery: Delivery, payload: Any, started: float, exc: Exception
    ) -> None:
        spec, attempt = self.spec, delivery.attempt
        error_type, error = type(exc).__name__, str(exc)[:MAX_ERROR_CHARS]
        fields = {
            "job": spec.name, "id": delivery.id, "attempt": attempt,
            "duration_ms": round((time.time() - started) * 1000, 3),
        }  # fmt: skip
        permanent = isinstance(exc, (Permanent, *spec.permanent))
        decision = decide(Outcome.PERMANENT if permanent else Outcome.FAILED, attempt, spec)
        tracing.failed(exc)
        if isinstance(decision, Retry):
            due_ms = int(time.time() * 1000) + decision.delay_ms
            delivery.trace = tracing.retried(delivery.trace)
            if self.records is not None:
                failure = ErrorInfo(type=error_type, message=error)
                self.records.retrying(delivery, int(started * 1000), failure, due_ms)
            await self._records_stored()  # a late `retrying` would hide the next run's `done`
            await self.receiver.retry(delivery, due_ms=due_ms, attempts=attempt)
            await self.signal(
                "retry", **fields, delay_ms=decision.delay_ms, run_at=due_ms,
                error_type=error_type, error=error,
            )  # fmt: skip
            return
        await self.signal("fail", **fields, phase="run", error_type=error_type, error=error)
        record = self._record(delivery, payload, error_type, error, attempt)
        await self._dead_letter(decision, delivery, record, started_ms=int(started * 1000))

    async def _unreported(self, delivery: Delivery, payload: Any) -> None:
        """A delivery past the last attempt: dead-letter what the last one left behind, unless
        its record says it finished (its ack was lost: a worker killed between the record and
        the ack, a lease that ran out while the record was being stored), which is settled."""
        record = self.unreported.get(delivery.key)
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
            record = self._record(delivery, payload, "WorkerCrashed", message, runs)
            await self.signal(
                "fail", job=self.spec.name, id=delivery.id, attempt=runs, phase="run",
                error_type="WorkerCrashed", error=message,
            )  # fmt: skip
        await self._dead_letter(decide(Outcome.UNREPORTED, delivery.attempt, self.spec),
                                delivery, record)  # fmt: skip

    def _record(
        self, delivery: Delivery, payload: Any, error_type: str, error: str, attempts: int,
        raw: bytes | None = None,
    ) -> DlqRecord:  # fmt: skip
        return make_record(
            delivery.subject, delivery.id, payload, error_type, error, attempts=attempts,
            first_enqueued_at=delivery.enqueued_at_ms, worker=self.instance_id, raw=raw,
            flow_key=delivery.flow_key,
        )  # fmt: skip

    async def _dead_letter(
        self, decision: Decision, delivery: Delivery, record: DlqRecord,
        started_ms: int | None = None,
    ) -> None:  # fmt: skip
        """Store the record, and only then settle the delivery (the receiver does both). If
        the store fails the delivery is released to come back and try again: nothing is lost,
        and the driver's dedup keeps a retried record single. The job's status record says
        `failed` before (stored), `dlq` after; a worker killed in between leaves `failed`,
        which a read shows as `dlq` once it is FAILED_GRACE_S old and its dead letter is
        stored (`read_status`)."""
        assert isinstance(decision, DeadLetter), decision  # the others are settled inline
        failure = ErrorInfo(type=record["error"]["type"], message=record["error"]["message"])
        if self.records is not None:
            self.records.ended(delivery, started_ms, "failed", failure, attempts=record["attempts"])
            await self.records.sent()
        try:
            if self._is_step(delivery):
                assert self.steps is not None
                await self.steps.ended(
                    delivery.id, "dlq", error=failure, attempts=record["attempts"]
                )  # fmt: skip
            await self._store_dead_letter(delivery, record, decision.terminate)
        except DriverUnavailable as exc:
            self.unreported[delivery.key] = record
            while len(self.unreported) > UNREPORTED_MEMO_SIZE:
                self.unreported.popitem(last=False)
            await self._hand_back(delivery, self.dlq_retry_delay_s)
            cause = exc.__cause__ or exc
            await self.signal(
                "fail", job=self.spec.name, id=record["id"], attempt=record["attempts"],
                phase="dlq_publish", error_type=type(cause).__name__,
                error=(str(cause) or repr(cause))[:MAX_ERROR_CHARS],
            )  # fmt: skip
            return
        self.unreported.pop(delivery.key, None)
        if self.records is not None:
            self.records.ended(delivery, started_ms, "dlq", failure, attempts=record["attempts"])
        await self.signal(
            "dlq", job=self.spec.name, id=record["id"], attempts=record["attempts"],
            error_type=record["error"]["type"], error=record["error"]["message"],
        )  # fmt: skip

    async def _store_dead_letter(
        self, delivery: Delivery, record: DlqRecord, terminate: bool
    ) -> None:
        """The record, and then the settle; a record over the engine's message cap (a payload
        near it, with the error beside it) is stored without its payload instead: kept for
        ever unstored, it would come back and fail the same way each time."""
        try:
            await self.receiver.dead_letter(delivery, record, terminate=terminate)
        except MessageTooLarge as exc:
            record["payload"] = None
            record.pop("raw_b64", None)
            note = f" [its payload was dropped from this record: {exc}]"
            record["error"]["message"] = record["error"]["message"][:MAX_ERROR_CHARS] + note
            await self.receiver.dead_letter(delivery, record, terminate=terminate)

    # -- control: cancels and the pause ------------------------------------------------------

    def _read_window(self) -> Window | None:
        """Start reading the lane's cancel window (see mega/jobs/control.py), unless a read
        started within `WINDOW_FRESH_S` (fetches come often when jobs are short: one read
        serves those that close together)."""
        if self.control is None or not self.control.on:
            return None
        last = self.window
        if last is not None and time.monotonic() - last.started_at < WINDOW_FRESH_S:
            return last
        read = asyncio.create_task(self.control.refresh_cancels())
        read.add_done_callback(_retrieved)  # one not awaited fails quietly: the next reads again
        self.window = Window(read, time.monotonic())
        return self.window

    async def _cancelled(
        self, deliveries: list[Delivery], window: Window | None
    ) -> set[str] | tuple[()]:
        """Which of the fetched jobs were cancelled, so that a cancel that returned before
        their fetch is seen: the window read beside the fetch, or read again when the fetch
        waited longer than `WINDOW_FRESH_S` for its jobs; then, while it is open, their
        marks. A read that does not answer within `CANCEL_READ_S` starts them unread."""
        if window is None or not deliveries:
            return ()
        control = self.control
        assert control is not None

        async def read() -> set[str]:
            if time.monotonic() - window.started_at > WINDOW_FRESH_S:
                await control.refresh_cancels()
            else:
                await window.read
            return await control.cancelled([delivery.id for delivery in deliveries])

        try:
            async with asyncio.timeout(min(CANCEL_READ_S, self.spec.ack_wait_s / 4)):
                found = await read()
        except (DriverUnavailable, TimeoutError) as exc:
            # Started unread: the watch still cancels a cancelled one within a second. Said
            # once until a read answers again, not at every fetch (an outage is hundreds).
            if not self.cancels_unread:
                why = str(exc) or "no answer in time"
                logger.warning(
                    "%s: cannot read its cancels (%s): its jobs start unread until it can",
                    self.spec.name, why,
                )  # fmt: skip
            self.cancels_unread += 1
            return ()
        if self.cancels_unread:
            logger.info(
                "%s: reads its cancels again (%d fetch(es) started unread)",
                self.spec.name, self.cancels_unread,
            )  # fmt: skip
            self.cancels_unread = 0
        return found

    async def _refresh(self) -> None:
        """Read the lane's pause and cancel window; a change of the pause holds or lets go
        the starts (`resumed`)."""
        assert self.control is not None
        was_paused = self.control.paused
        await self.control.refresh()
        if self.control.paused and not was_paused:
            self.resumed.clear()
            logger.info(
                "%s: paused: running jobs finish; up to %d fetched ones wait, none start",
                self.spec.name, self.spec.concurrency,
            )  # fmt: skip
        elif was_paused and not self.control.paused:
            self.resumed.set()
            logger.info("%s: resumed", self.spec.name)

    async def _skip(self, delivery: Delivery, started_ms: int | None = None) -> None:
        """Settle a cancelled job's delivery without running it (again): its record counts
        the runs made, this delivery's only when it was running (`started_ms`)."""
        if self._is_step(delivery) and not await self._step_ended(delivery, "cancelled"):
            return
        if self.records is not None:
            runs = delivery.attempt if started_ms is not None else delivery.attempt - 1
            self.records.ended(delivery, started_ms, "cancelled", None, attempts=runs)
        await self._ack_after_records(delivery)
        await self.signal("cancel", job=self.spec.name, id=delivery.id, attempt=delivery.attempt,
                          running=started_ms is not None)  # fmt: skip

    async def _watch(self) -> None:
        """Every WATCH_S: the pause (no new starts while it holds) and, while the cancel
        window is open, the cancels of the running jobs (their tasks are cancelled)."""
        assert self.control is not None
        while True:
            await asyncio.sleep(WATCH_S)
            try:
                await self._refresh()
                cancelled = await self.control.cancelled(
                    [lease.delivery.id for lease in self.running.values() if not lease.cancelled]
                )
            except DriverUnavailable as exc:
                logger.warning("%s: cannot read its pause and cancels (%s)", self.spec.name, exc)
                continue
            for task, lease in list(self.running.items()):
                if lease.delivery.id in cancelled:
                    lease.cancelled = True
                    task.cancel()

    async def _heartbeat(self) -> None:
        """Extend the ack wait of every job running for a third of it (one task for all)."""
        interval_s = self.spec.ack_wait_s / 3
        while True:
            await asyncio.sleep(interval_s)
            now = time.monotonic()
            extended = []
            for lease in list(self.running.values()):
                if now - lease.extended_at >= interval_s:
                    lease.extended_at = now
                    await self.receiver.extend(lease.delivery)
                    extended.append(lease.delivery)
            if self.gate is not None:
                await self.gate.renew(extended)

    async def _present(self) -> None:
        """Write this loop's presence record now and every PRESENCE_EVERY_S."""
        assert self.presence is not None
        while True:
            try:
                await self.presence.write(running=len(self.running), done=self.settled)
            except DriverUnavailable as exc:
                logger.debug("%s: presence record not written (%s)", self.spec.name, exc)
            await asyncio.sleep(PRESENCE_EVERY_S)

    async def _absent(self) -> None:
        """Mark the presence record stopped (bounded: a stop never waits on it for long)."""
        assert self.presence is not None
        try:
            async with asyncio.timeout(PRESENCE_STOP_S):
                await self.presence.write(running=0, done=self.settled, stopped=True)
        except (DriverUnavailable, TimeoutError) as exc:
            logger.debug("%s: presence record not marked stopped (%s)", self.spec.name, exc)

    async def _drain(self) -> None:
        deadline = time.monotonic() + self.drain_timeout_s
        while self.running and (remaining := deadline - time.monotonic()) > 0:
            await asyncio.wait(list(self.running), timeout=remaining)
        if await cancel_and_wait(list(self.running), LOOPS_STOP_S):
            logger.warning("%s: a run went on after its cancel; left to the exit", self.spec.name)


def _retrieved(task: asyncio.Task[None]) -> None:
    if not task.cancelled():
        task.exception()
