"""The consume loop of one job in one worker process: `_Consumer`, run by `JobQueue.consume`.

What to do with each delivery is decided by `delivery.decide` (pure, table-tested); this module
carries the decision out on the broker. Attempts are JetStream's own delivery count,
`num_delivered`, plus the attempts made before the message (`Mega-Attempts`), so they survive a
worker crash. A retry is a new message, a broker-side schedule (nats-server 2.12+) that lands on
the requeue subject at the backoff's end, and the failed one is acked once it is stored: a job
backing off holds no slot of the group's `concurrency`. Without schedules (an older server, a
stream made before it) a retry is `nak(delay=backoff)`, and the message holds its slot while it
waits.
A delivery beyond `retries + 1` means the last attempt never reported back (the job killed its
worker): it goes straight to the DLQ as `WorkerCrashed` instead of running again.
Tries exhausted: the DLQ record is published and, only after its PubAck, the original is acked
(or termed, for a message that cannot be decoded); a failed DLQ publish naks with a delay.

Pull requests ask for at most the free slots, messages are run as they arrive (no waiting for a
batch to fill, which is what keeps start latency low), running jobs renew their lease every
`ack_wait_s / 3`, a NATS outage is waited out, never fatal, and a stop drains in-flight jobs up
to a timeout, then hands the rest back.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from typing import TYPE_CHECKING, Any, Protocol

import nats.errors
from nats.aio.msg import Msg
from nats.js.errors import APIError

from mega.errors import MegaError
from mega.jobs.backoff import BackoffPolicy
from mega.jobs.delivery import DeadLetter, Decision, Outcome, Retry, decide, is_unreported
from mega.jobs.dlq import DlqRecord, make_record, publish_record
from mega.jobs.job import (
    HEADER_ATTEMPTS,
    HEADER_RUN_AT,
    SCHEDULES_SINCE,
    schedule_headers,
    schedule_subject,
)

if TYPE_CHECKING:
    from nats.aio.client import Client as NatsClient
    from nats.js import JetStreamContext


# The queue's logger: to an operator, the consume loop is part of the job queue.
logger = logging.getLogger("mega.jobqueue")

# Errors that mean "NATS is not answering right now" rather than "this request is wrong".
NATS_ERRORS = (nats.errors.Error, asyncio.TimeoutError, OSError)

# A pull request lives this long on the server; an idle loop renews it this often.
PULL_EXPIRES_S = 5.0
# Credit of pull requests that never answered (lost in an outage) is forgotten this much after
# they should have expired.
PULL_GRACE_S = 1.0
# Pull again once this fraction of the slots is free (or nothing is asked at all): one request
# per half window keeps messages flowing without one request per job.
REFILL_FRACTION = 0.5
# An idle loop wakes this often to notice a reconnect (pull requests do not survive one).
HOUSEKEEPING_S = 0.5
# Pause after NATS refused a pull (JetStream restarting, consumer gone) before asking again.
OUTAGE_BACKOFF_S = 0.25
# A job cut off by the drain timeout is handed back to be redelivered after this long.
HAND_BACK_DELAY_S = 1.0
# nats-py sends a bare nak for nak(delay=0): a zero backoff still takes the delayed path.
MIN_NAK_DELAY_S = 0.001
# DLQ records whose publish failed, kept so the redelivery carries the real error.
UNREPORTED_MEMO_SIZE = 1024
# Error messages in signals and DLQ records are cut to this many characters.
MAX_ERROR_CHARS = 2000


class QueueLink(Protocol):
    """What a consume loop needs from its queue (a JobQueue, an EventBus), and nothing more."""

    nc: NatsClient
    js: JetStreamContext
    instance_id: str
    dlq_retry_delay_s: float

    async def signal(self, name: str, **fields: Any) -> None:
        """Send a signal to the queue's observers."""
        ...


class ConsumeSpec(Protocol):
    """What a consume loop needs to know of what it consumes (a JobSpec, a ListenerSpec)."""

    @property
    def name(self) -> str: ...  # in signals and logs
    @property
    def stream(self) -> str: ...
    @property
    def durable(self) -> str: ...  # the durable consumer on `stream`
    @property
    def concurrency(self) -> int: ...
    @property
    def ack_wait_s(self) -> float: ...
    @property
    def max_attempts(self) -> int: ...
    @property
    def backoff(self) -> BackoffPolicy: ...
    @property
    def dlq_subject(self) -> str: ...
    def message_id(self, headers: dict[str, str]) -> str | None:
        """The id a message carries in its headers (None: the loop names it by sequence)."""
        ...

    @property
    def enqueued_header(self) -> str: ...  # epoch ms of the first enqueue (or emit)

    def record_subject(self, subject: str, headers: dict[str, str]) -> str:
        """The subject a DLQ record names for a message of this spec."""
        ...

    @property
    def requeue_subject(self) -> str: ...  # where a retry (or a DLQ requeue) comes back
    def requeue_headers(self, record: Mapping[str, Any]) -> dict[str, str]:
        """The headers of a message that brings back what `record` describes (id, subject,
        first_enqueued_at)."""
        ...


# Runs one decoded message: (payload, the message, attempt). Raising fails the attempt.
Handler = Callable[[Any, Msg, int], Awaitable[None]]


class _Lease:
    """A message being run and when its ack wait was last renewed (monotonic s)."""

    __slots__ = ("msg", "renewed_at")

    def __init__(self, msg: Msg, renewed_at: float) -> None:
        self.msg = msg
        self.renewed_at = renewed_at


class _Consumer:
    """One job's consume loop in this process.

    Why not `PullSubscription.fetch(n)`: once the stream is empty, fetch waits for all `n`
    messages or its timeout, so a lone job would wait seconds for a batch to fill. Here pull
    requests are sent by hand (`$JS.API.CONSUMER.MSG.NEXT`) to one inbox, and every message
    starts its job the moment it lands. `credits` counts messages asked for and not yet
    received; asking only for `concurrency - running - credits` keeps this process within its
    slots, and the consumer's max_ack_pending keeps the whole group within `concurrency`.
    """

    def __init__(
        self,
        queue: QueueLink,
        spec: ConsumeSpec,
        handler: Handler,
        restore: Callable[[], Awaitable[object]],
    ) -> None:
        self.queue = queue
        self.spec = spec
        self.handler = handler
        self.restore = restore
        self.nc = queue.nc
        self.running: dict[asyncio.Task[None], _Lease] = {}
        self.credits = 0
        self.credits_expire_at = 0.0
        self.refill_at = max(1, math.ceil(spec.concurrency * REFILL_FRACTION))
        self.pause_until = 0.0
        self.needs_ensure = False
        self.last_warning = ""
        self.wakeup = asyncio.Event()
        self.stopping = False
        self.drain_timeout_s = 0.0
        self.closed = asyncio.Event()
        self.unreported: OrderedDict[int, DlqRecord] = OrderedDict()
        self.pull_subject = f"$JS.API.CONSUMER.MSG.NEXT.{spec.stream}.{spec.durable}"
        self.pull_expires_ns = int(PULL_EXPIRES_S * 1e9)
        self.schedules = schedules_supported(self.nc)

    def request_stop(self, timeout_s: float) -> None:
        self.stopping = True
        self.drain_timeout_s = timeout_s
        self.wakeup.set()

    async def run(self) -> None:
        inbox = self.nc.new_inbox()
        sub = await self.nc.subscribe(inbox, cb=self._on_message)
        heartbeat = asyncio.create_task(self._heartbeat())
        try:
            await self._pull_loop(inbox)
            await self._drain()
        finally:
            heartbeat.cancel()
            # Left only if run() itself was cancelled, or a message landed after the drain.
            for task in self.running:
                task.cancel()
            with contextlib.suppress(*NATS_ERRORS):
                await sub.unsubscribe()
            self.closed.set()

    # -- pulling ----------------------------------------------------------------------------

    async def _pull_loop(self, inbox: str) -> None:
        reconnects = self.nc.stats["reconnects"]
        while not self.stopping:
            self.wakeup.clear()
            now = time.monotonic()
            if self.nc.stats["reconnects"] != reconnects or (
                self.credits and now > self.credits_expire_at
            ):
                # Requests made before a reconnect are gone and will never answer. A late
                # message of one is still capped by max_ack_pending.
                reconnects = self.nc.stats["reconnects"]
                self.credits = 0
            if self.needs_ensure and now >= self.pause_until:
                await self._ensure_again()
            free = self.spec.concurrency - len(self.running) - self.credits
            if (
                free > 0
                and (free >= self.refill_at or self.credits == 0)
                and now >= self.pause_until
                and self.nc.is_connected
            ):
                await self._pull(inbox, free, now)
            wait_s = HOUSEKEEPING_S
            if self.pause_until > now:
                wait_s = min(wait_s, self.pause_until - now)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait_s):
                    await self.wakeup.wait()

    async def _pull(self, inbox: str, batch: int, now: float) -> None:
        request = b'{"batch":%d,"expires":%d}' % (batch, self.pull_expires_ns)
        try:
            await self.nc.publish(self.pull_subject, request, reply=inbox)
        except NATS_ERRORS as exc:
            logger.debug("%s: pull failed (%s); retrying", self.spec.name, exc)
            self.pause_until = now + OUTAGE_BACKOFF_S
            return
        self.credits += batch
        self.credits_expire_at = now + PULL_EXPIRES_S + PULL_GRACE_S

    async def _ensure_again(self) -> None:
        self.needs_ensure = False
        try:
            await self.restore()
        except MegaError as exc:
            self._warn(f"{self.spec.name}: cannot restore its stream/consumer yet: {exc}")
            self.needs_ensure = True
            self.pause_until = time.monotonic() + OUTAGE_BACKOFF_S

    async def _on_message(self, msg: Msg) -> None:
        if not msg.reply:  # job messages carry an ack subject; status messages do not
            self._on_status(msg)
            return
        if self.credits:
            self.credits -= 1
        task = asyncio.create_task(self._process(msg))
        self.running[task] = _Lease(msg, time.monotonic())
        task.add_done_callback(self._on_done)

    def _on_status(self, msg: Msg) -> None:
        headers = msg.headers or {}
        status = headers.get("Status", "")
        if status == "100":  # idle heartbeat (not asked for)
            return
        # The request is over: drop what it will never deliver (all of it if the server
        # does not say).
        unfilled = headers.get("Nats-Pending-Messages")
        self.credits = max(0, self.credits - int(unfilled)) if unfilled else 0
        if status != "408":  # anything but a plain expiry: the consumer is not being served
            description = headers.get("Description", "")
            self._warn(f"{self.spec.name}: pull answered {status} {description}")
            self.pause_until = time.monotonic() + OUTAGE_BACKOFF_S
            if status == "404" or "deleted" in description.lower():
                self.needs_ensure = True
        self.wakeup.set()

    def _on_done(self, task: asyncio.Task[None]) -> None:
        self.running.pop(task, None)
        if not task.cancelled() and task.exception() is not None:
            logger.error("%s: job task crashed", self.spec.name, exc_info=task.exception())
        free = self.spec.concurrency - len(self.running) - self.credits
        if free >= self.refill_at or (free > 0 and not self.credits):
            self.wakeup.set()

    def _warn(self, message: str) -> None:
        # An outage repeats the same answer several times a second: say it once.
        if message != self.last_warning:
            logger.warning("%s", message)
            self.last_warning = message

    # -- running ----------------------------------------------------------------------------

    async def _process(self, msg: Msg) -> None:
        spec = self.spec
        meta = msg.metadata
        headers = msg.headers or {}
        attempt = (_int_header(headers, HEADER_ATTEMPTS) or 0) + meta.num_delivered
        job_id = job_id_of(spec, msg)
        enqueued_at = _int_header(headers, spec.enqueued_header)
        try:
            payload = json.loads(msg.data)
        except ValueError as exc:  # also bad UTF-8
            await self.queue.signal(
                "fail", job=spec.name, id=job_id, attempt=attempt, phase="decode",
                error_type="DecodeError", error=str(exc),
            )  # fmt: skip
            record = self._record(
                msg, None, "DecodeError", str(exc), attempts=attempt, raw=msg.data
            )
            await self._dead_letter(decide(Outcome.UNDECODABLE, attempt, spec), msg, record)
            return
        if is_unreported(attempt, spec):
            unreported = self.unreported.get(meta.sequence.stream)
            if unreported is None:  # not a DLQ publish of ours that failed: a crash
                # This delivery is not an attempt: the signal, like the record, names the last
                # attempt, the one that never reported back.
                runs = attempt - 1
                message = (
                    f"attempt {runs} of {spec.max_attempts} never reported back: its worker died "
                    "(crash, os._exit, OOM kill) or its DLQ record could not be written"
                )
                unreported = self._record(msg, payload, "WorkerCrashed", message, attempts=runs)
                await self.queue.signal(
                    "fail", job=spec.name, id=job_id, attempt=runs, phase="run",
                    error_type="WorkerCrashed", error=message,
                )  # fmt: skip
            await self._dead_letter(decide(Outcome.UNREPORTED, attempt, spec), msg, unreported)
            return
        started = time.time()
        run_at = _int_header(headers, HEADER_RUN_AT) or enqueued_at
        await self.queue.signal(
            "start", job=spec.name, id=job_id, attempt=attempt,
            latency_ms=None if run_at is None else max(0, round(started * 1000) - run_at),
        )  # fmt: skip
        try:
            await self.handler(payload, msg, attempt)
        except asyncio.CancelledError:
            # Cut off by the drain timeout: hand it back now rather than after the ack wait.
            await _settle(msg.nak(delay=HAND_BACK_DELAY_S))
            raise
        except Exception as exc:
            error_type, error = type(exc).__name__, str(exc)[:MAX_ERROR_CHARS]
            fields = {
                "job": spec.name, "id": job_id, "attempt": attempt,
                "duration_ms": round((time.time() - started) * 1000, 3),
            }  # fmt: skip
            decision = decide(Outcome.FAILED, attempt, spec)
            if isinstance(decision, Retry):
                due_ms = await self._retry(msg, job_id, enqueued_at, attempt, decision.delay_ms)
                await self.queue.signal(
                    "retry", **fields, delay_ms=decision.delay_ms, run_at=due_ms,
                    error_type=error_type, error=error,
                )  # fmt: skip
                return
            await self.queue.signal(
                "fail", **fields, phase="run", error_type=error_type, error=error
            )
            record = self._record(msg, payload, error_type, error, attempts=attempt)
            await self._dead_letter(decision, msg, record)
            return
        await _settle(msg.ack())
        await self.queue.signal(
            "done", job=spec.name, id=job_id, attempt=attempt,
            duration_ms=round((time.time() - started) * 1000, 3),
        )  # fmt: skip

    async def _retry(
        self, msg: Msg, job_id: str, enqueued_at: int | None, attempt: int, delay_ms: int
    ) -> int:
        """The next attempt as a message scheduled for the backoff's end, then ack this one
        (a job backing off holds no slot). Where schedules are missing, or the publish fails,
        nak with the delay instead: the message comes back, holding its slot meanwhile.
        Returns when the next attempt is due (epoch ms)."""
        due_ms = int(time.time() * 1000) + delay_ms
        if self.schedules:
            spec, headers = self.spec, msg.headers or {}
            copy = spec.requeue_headers(
                {"id": job_id, "subject": spec.record_subject(msg.subject, headers),
                 "first_enqueued_at": enqueued_at}
            )  # fmt: skip
            copy[HEADER_RUN_AT] = str(due_ms)
            copy[HEADER_ATTEMPTS] = str(attempt)
            copy.update(schedule_headers(spec.requeue_subject, due_ms))
            try:
                await self.queue.js.publish(
                    schedule_subject(spec.requeue_subject), msg.data, headers=copy
                )
            except APIError as exc:  # the stream refuses schedules (made before 2.12)
                self.schedules = False
                logger.warning(
                    "%s: its stream takes no message schedules (%s): a retry waits holding its "
                    "slot (recreate the stream on nats-server 2.12+ to lift this)",
                    spec.name, exc.description,
                )  # fmt: skip
            except NATS_ERRORS as exc:
                logger.debug("%s: retry not scheduled (%s); nak instead", spec.name, exc)
            else:
                await _settle(msg.ack())
                return due_ms
        await _settle(msg.nak(delay=max(delay_ms / 1000, MIN_NAK_DELAY_S)))
        return due_ms

    def _record(
        self,
        msg: Msg,
        payload: Any,
        error_type: str,
        error: str,
        *,
        attempts: int,
        raw: bytes | None = None,
    ) -> DlqRecord:
        spec, headers = self.spec, msg.headers or {}
        return make_record(
            spec.record_subject(msg.subject, headers),
            job_id_of(spec, msg),
            payload, error_type, error, attempts=attempts,
            first_enqueued_at=_int_header(headers, spec.enqueued_header),
            worker=self.queue.instance_id, raw=raw,
        )  # fmt: skip

    async def _dead_letter(self, decision: Decision, msg: Msg, record: DlqRecord) -> None:
        """Dead-letter: publish the record, wait for its PubAck, and only then ack (or term)
        the original. If the publish fails the original is nacked with a delay, so it comes
        back and tries again: nothing is lost, and the dedup id keeps a retried record single."""
        assert isinstance(decision, DeadLetter), decision  # the other decisions are settled inline
        seq = msg.metadata.sequence.stream
        try:
            await publish_record(self.queue.js, self.spec.dlq_subject, record, seq=seq)
        except NATS_ERRORS as exc:
            self.unreported[seq] = record
            while len(self.unreported) > UNREPORTED_MEMO_SIZE:
                self.unreported.popitem(last=False)
            await _settle(msg.nak(delay=self.queue.dlq_retry_delay_s))
            await self.queue.signal(
                "fail", job=self.spec.name, id=record["id"], attempt=record["attempts"],
                phase="dlq_publish", error_type=type(exc).__name__, error=str(exc) or repr(exc),
            )  # fmt: skip
            return
        self.unreported.pop(seq, None)
        await _settle(msg.term() if decision.terminate else msg.ack())
        await self.queue.signal(
            "dlq", job=self.spec.name, id=record["id"], attempts=record["attempts"],
            error_type=record["error"]["type"], error=record["error"]["message"],
        )  # fmt: skip

    async def _heartbeat(self) -> None:
        """Renew the ack wait of every job running for a third of it (one task for all)."""
        interval_s = self.spec.ack_wait_s / 3
        while True:
            await asyncio.sleep(interval_s)
            now = time.monotonic()
            for lease in list(self.running.values()):
                if now - lease.renewed_at >= interval_s:
                    lease.renewed_at = now
                    await _settle(lease.msg.in_progress())

    async def _drain(self) -> None:
        deadline = time.monotonic() + self.drain_timeout_s
        # Messages of earlier pull requests may still land and join `running` meanwhile.
        while self.running and (remaining := deadline - time.monotonic()) > 0:
            await asyncio.wait(list(self.running), timeout=remaining)
        leftovers = list(self.running)
        for task in leftovers:
            task.cancel()
        if leftovers:
            await asyncio.wait(leftovers)


def job_id_of(spec: ConsumeSpec, msg: Msg) -> str:
    """The id a message carries, or `<stream>:<sequence>` for one published without it."""
    return spec.message_id(msg.headers or {}) or f"{spec.stream}:{msg.metadata.sequence.stream}"


def schedules_supported(nc: NatsClient) -> bool:
    """Whether the connected nats-server has message schedules (2.12+)."""
    version = nc.connected_server_version
    return (version.major, version.minor) >= SCHEDULES_SINCE


async def _settle(reply: Coroutine[Any, Any, Any]) -> None:
    """Send an ack/nak/term/progress; if NATS is away the message is simply redelivered later."""
    try:
        await reply
    except NATS_ERRORS as exc:
        logger.debug("ack not sent (%s); the message will be redelivered", exc)


def _int_header(headers: dict[str, str], name: str) -> int | None:
    value = headers.get(name)
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None
