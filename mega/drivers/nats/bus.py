"""The `nats` driver: jobs and events on NATS JetStream (the default). Names in names.py.

A job message is the JSON payload as body plus headers: `Mega-Job-Id`, `Mega-Enqueued-At`
(epoch ms), `Mega-Run-At` (delayed or requeued jobs) and `Nats-Msg-Id` when the caller gave an
id (JetStream drops a duplicate within its 2 minute window). A delayed job is a broker-side
message schedule (nats-server 2.12+): it waits in the stream on `<subject>._delay.<token>` and
the server publishes a fresh copy onto `<subject>` at its time, so it holds no worker slot,
no max_ack_pending and no delivery while it waits. A DLQ requeue publishes a new message, so
its delivery count (the attempt) restarts at 1. Streams are created where missing and never
changed (their limits are the operator's); consumers are created explicitly and bound. A lane's
records live in key-value buckets (records.py) whose keep changes only with `apply_limits`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import Sequence
from typing import ClassVar

from nats.js import JetStreamContext
from nats.js.api import (
    AckPolicy,
    ConsumerConfig,
    DeliverPolicy,
    RawStreamMsg,
    RetentionPolicy,
    StorageType,
    StreamConfig,
)
from nats.js.errors import NotFoundError

from mega.drivers.base import (
    DEDUP_WINDOW_S,
    DriverUnavailable,
    Lane,
    LaneStats,
    Message,
)
from mega.drivers.nats.core import ensure_stream
from mega.drivers.nats.dead import NatsDeadLetters, dlq_stream_config, ensure_dlq_stream
from mega.drivers.nats.errors import NATS_ERRORS
from mega.drivers.nats.events import NatsEventLog
from mega.drivers.nats.names import (
    DELAY_TOKEN,
    HEADER_EMITTED_AT,
    HEADER_ENQUEUED_AT,
    HEADER_FLOW_KEY,
    HEADER_JOB_ID,
    HEADER_RUN_AT,
    NATS_MSG_ID,
    dlq_stream_of,
    durable_of,
    fair_stream_of,
    fair_subject,
    fair_subjects_of,
    fair_wake_of,
    filter_subjects_of,
    schedule_headers,
    schedule_subject,
    stream_of,
)
from mega.drivers.nats.receiver import NatsReceiver
from mega.drivers.nats.records import (
    NatsRecordStore,
    ensure_buckets,
)
from mega.errors import JobError

logger = logging.getLogger("mega.jobqueue")


class NatsBus(NatsDeadLetters, NatsRecordStore, NatsEventLog):
    """A bus on NATS JetStream: the lanes here, the rest in its parts (see `NatsCore`)."""

    driver: ClassVar[str] = "nats"
    fair_lanes: ClassVar[bool] = True
    priority_lanes: ClassVar[bool] = True

    async def ensure(self, lane: Lane, *, apply_limits: bool) -> None:
        """The lane's streams, record buckets and durable consumer, where missing. An existing
        consumer keeps its limits (ack wait, max_ack_pending) and a bucket its keep unless
        `apply_limits`: a difference is said in one line (see `ensure_consumer`)."""
        self._apply_limits[lane] = apply_limits
        await self.patiently(lane.name, lambda: self._ensure_once(lane, apply_limits))

    async def _ensure_once(self, lane: Lane, apply_limits: bool) -> None:
        """One pass of `ensure`: the streams the consumer reads, the dead letters, the record
        buckets (of the tables whose keep is above 0), the consumer."""
        await self._ensure_read_streams(lane)
        await ensure_dlq_stream(self.js, dlq_stream_config(lane))
        await ensure_buckets(self.js, lane, apply_limits=apply_limits)
        await self._ensure_consumer(lane, apply_limits)

    async def _ensure_read_streams(self, lane: Lane) -> None:
        """A job's stream and, for a fair job, its keys' stream (a group reads the events
        stream, made by `ensure_events`)."""
        if lane.kind == "job":
            await ensure_stream(
                self.js,
                StreamConfig(
                    name=stream_of(lane),
                    subjects=[lane.subject, f"{lane.subject}.{DELAY_TOKEN}.*"],
                    retention=RetentionPolicy.WORK_QUEUE,
                    storage=StorageType.FILE,
                    duplicate_window=DEDUP_WINDOW_S,
                    allow_msg_schedules=True if self.schedules_supported else None,
                    num_replicas=lane.replicas,
                ),
            )
        if lane.turns:
            await ensure_stream(
                self.js,
                StreamConfig(
                    name=fair_stream_of(lane),
                    subjects=[fair_subjects_of(lane)],
                    retention=RetentionPolicy.LIMITS,
                    storage=StorageType.FILE,
                    duplicate_window=DEDUP_WINDOW_S,
                    allow_direct=True,
                    num_replicas=lane.replicas,
                ),
            )

    async def _ensure_consumer(self, lane: Lane, apply_limits: bool) -> None:
        wanted = ConsumerConfig(
            durable_name=durable_of(lane),
            ack_policy=AckPolicy.EXPLICIT,
            deliver_policy=DeliverPolicy.ALL,
            ack_wait=lane.ack_wait_s,
            max_ack_pending=lane.concurrency,
            max_deliver=-1,  # the consume loop decides when a job is dead
        )
        if lane.kind == "job":
            wanted.filter_subject = lane.subject
        else:
            wanted.filter_subjects = filter_subjects_of(lane)
        self._max_ack_pending[lane] = await ensure_consumer(
            self.js, stream_of(lane), wanted, what=lane.name, apply_limits=apply_limits
        )

    def window_safe(self, lane: Lane) -> bool:
        """Whether the lane's consumer caps unacked messages at the lane's concurrency (its
        receiver may then keep a whole window of pull requests open)."""
        return self._max_ack_pending.get(lane) == lane.concurrency

    async def restore(self, lane: Lane) -> None:
        """Make what a lane's pulls need exist again, its streams and its consumer (a
        JetStream that lost them), and nothing else: a dead-letter stream or a record bucket
        that cannot be reached (a single copy on a node that is down) must not keep the lane
        from being served. A lost dead-letter stream keeps its jobs unsettled until `ensure`
        with `force` makes it again."""
        if lane.kind == "group" and self._events_max_age_s is not None:
            await self.ensure_events(max_age_s=self._events_max_age_s)
        await self._ensure_read_streams(lane)
        await self._ensure_consumer(lane, self._apply_limits.get(lane, False))

    async def publish(self, lane: Lane, messages: Sequence[Message]) -> list[bool]:
        """Store jobs: one is published and awaited (its PubAck), many are pipelined."""
        if any(m.run_at_ms is not None for m in messages) and not self.schedules_supported:
            raise JobError(
                f"{lane.name}: delayed jobs need nats-server 2.12+ (message schedules)",
                code="job.delay_unsupported",
            )
        self._check_connected()
        envelopes = [job_envelope(m) for m in messages]
        if lane.turns:  # a due job waits for its key's (its band's) turn (fair.py)
            envelopes = [
                (fair_subject(lane, lane.turn_key(m)), body, headers)
                if m.run_at_ms is None
                else (subject, body, headers)
                for m, (subject, body, headers) in zip(messages, envelopes, strict=True)
            ]
            stored = await self.publish_envelopes(envelopes)
            with contextlib.suppress(*NATS_ERRORS):  # a receiver also feeds at its next fetch
                await self.native.publish(fair_wake_of(lane), b"")
            return stored
        return await self.publish_envelopes(envelopes)

    async def stats(self, lane: Lane) -> LaneStats:
        """The consumer's counts, and two reads more, sent together (one round trip's wait):
        `stored` is the lane's stream's last sequence (a job's: every job, delayed jobs and
        retries counted again at each schedule and each copy; a group's: the events log, every
        event and requeue); `oldest_ms` is the `Mega-Enqueued-At` (`Mega-Emitted-At`) of the
        first message past the consumer's ack floor on the lane's subjects (a direct look-up
        by subject, one per subject), so schedules not due yet are left out. A retry's copy is
        a message stored anew, read where it stands in the stream."""
        try:
            consumer, dlq, stream, fair = await asyncio.gather(
                self.js.consumer_info(stream_of(lane), durable_of(lane)),
                self.js.stream_info(dlq_stream_of(lane)),
                self.js.stream_info(stream_of(lane)),
                self._fair_waiting(lane),
            )
            unsettled = (consumer.num_pending or 0) + (consumer.num_ack_pending or 0)
            floor = consumer.ack_floor.stream_seq if consumer.ack_floor else 0
            oldest = await self._oldest_ms(lane, (floor or 0) + 1) if unsettled else None
        except NATS_ERRORS as exc:  # NotFoundError included
            raise DriverUnavailable(str(exc) or type(exc).__name__) from exc
        return LaneStats(
            pending=(consumer.num_pending or 0) + fair,
            in_flight=consumer.num_ack_pending or 0,
            dlq=dlq.state.messages,
            oldest_ms=oldest,
            stored=stream.state.last_seq or 0,
        )

    async def _fair_waiting(self, lane: Lane) -> int:
        """How many of a fair (prioritized) lane's jobs wait for their key's (band's) turn
        (0: neither)."""
        if not lane.turns:
            return 0
        return (await self.js.stream_info(fair_stream_of(lane))).state.messages

    async def _oldest_ms(self, lane: Lane, start: int) -> int | None:
        """When the first message at or past `start` on the lane's subjects was enqueued."""
        subjects = [lane.subject] if lane.kind == "job" else filter_subjects_of(lane)

        async def first(subject: str) -> RawStreamMsg | None:
            try:
                return await self.js.get_msg(stream_of(lane), seq=start, subject=subject, next=True)
            except NotFoundError:
                return None

        found = [msg for msg in await asyncio.gather(*map(first, subjects)) if msg is not None]
        if not found:
            return None
        msg = min(found, key=lambda msg: msg.seq or 0)
        headers = msg.headers or {}
        stamp = headers.get(HEADER_ENQUEUED_AT) or headers.get(HEADER_EMITTED_AT)
        if stamp is not None and stamp.isdigit():
            return int(stamp)
        return int(msg.time.timestamp() * 1000) if msg.time is not None else None

    def receiver(self, lane: Lane, *, consumer: str) -> NatsReceiver:
        return NatsReceiver(self, lane, self.watch.hooks)


def job_envelope(message: Message) -> tuple[str, bytes, dict[str, str]]:
    """Subject, body and headers of a job message (a schedule when it is due later)."""
    headers = {HEADER_ENQUEUED_AT: str(message.enqueued_at_ms)}
    if message.dedup:
        headers[NATS_MSG_ID] = message.id
    headers[HEADER_JOB_ID] = message.id
    if message.flow_key is not None:
        headers[HEADER_FLOW_KEY] = message.flow_key
    if message.trace:
        headers.update(message.trace)
    if message.run_at_ms is None:
        return message.subject, message.body, headers
    headers[HEADER_RUN_AT] = str(message.run_at_ms)
    headers.update(schedule_headers(message.subject, message.run_at_ms))
    return schedule_subject(message.subject), message.body, headers


async def ensure_consumer(
    js: JetStreamContext, stream: str, wanted: ConsumerConfig, *, what: str, apply_limits: bool
) -> int | None:
    """Create a durable consumer, or bring an existing one in line with `wanted`. Its limits
    (`ack_wait`, `max_ack_pending`: the class's `ack_wait_s` and `concurrency`) change only with
    `apply_limits`; otherwise a difference is said in one line and the running limits are kept,
    so a stale deployment cannot silently rewrite the whole fleet's. Returns the
    max_ack_pending the consumer runs with."""
    assert wanted.durable_name is not None
    try:
        have = (await js.consumer_info(stream, wanted.durable_name)).config
    except NotFoundError:
        await js.add_consumer(stream, wanted)
        return wanted.max_ack_pending
    running = (have.ack_wait, have.max_ack_pending)
    declared = (wanted.ack_wait, wanted.max_ack_pending)
    if running != declared:
        change = (
            f"{what}: the running consumer has concurrency {have.max_ack_pending} and ack wait "
            f"{have.ack_wait:g} s, the class says {wanted.max_ack_pending} and "
            f"{wanted.ack_wait:g} s"
        )
        if apply_limits:
            logger.info("%s: applying the class's (--apply-limits)", change)
        else:
            logger.warning(
                "%s: keeping the running ones (start with --apply-limits, or set "
                "apply_limits = True in the config, to change them)",
                change,
            )
            wanted = dataclasses.replace(
                wanted, ack_wait=have.ack_wait, max_ack_pending=have.max_ack_pending
            )
    fields = ("ack_wait", "max_ack_pending", "filter_subject", "filter_subjects")
    if not all(getattr(have, name) == getattr(wanted, name) for name in fields):
        # Without an action the server creates, or updates the editable fields in place.
        await js.add_consumer(stream, wanted)
    return wanted.max_ack_pending
