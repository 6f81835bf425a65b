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
import json
import logging
import math
import random
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any, ClassVar, Self
from urllib.parse import urlsplit

from nats.aio.client import Client as NatsClient
from nats.aio.client import Server
from nats.aio.msg import Msg
from nats.errors import MaxPayloadError, NoRespondersError
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js import JetStreamContext
from nats.js.api import (
    AckPolicy,
    ConsumerConfig,
    DeliverPolicy,
    PubAck,
    RawStreamMsg,
    RetentionPolicy,
    StorageType,
    StreamConfig,
)
from nats.js.errors import APIError, NotFoundError

from mega.config import BusSpec
from mega.constants import (
    CONNECT_TIMEOUT_S,
    HOW_TO_GET_SERVICES,
    NATS_MAX_OUTSTANDING_PINGS,
    NATS_PING_INTERVAL_S,
    NATS_RECONNECT_WAIT_S,
)
from mega.drivers.base import (
    DEDUP_WINDOW_S,
    DlqRecord,
    DriverUnavailable,
    Lane,
    LaneStats,
    Message,
    MessageTooLarge,
    Table,
)
from mega.drivers.nats.acks import BULK_TIMEOUT_PER_MSG_S, BULK_TIMEOUT_S, AckMux
from mega.drivers.nats.errors import NATS_ERRORS
from mega.drivers.nats.names import (
    DELAY_TOKEN,
    EVENT_PREFIX,
    EVENTS_STREAM,
    HEADER_EMITTED_AT,
    HEADER_ENQUEUED_AT,
    HEADER_FLOW_KEY,
    HEADER_JOB_ID,
    HEADER_RUN_AT,
    NATS_MSG_ID,
    REQUEUE_PREFIX,
    bucket_of,
    dlq_record_subject,
    dlq_stream_of,
    dlq_subject_of,
    durable_of,
    fair_stream_of,
    fair_subject,
    fair_subjects_of,
    fair_wake_of,
    filter_subjects_of,
    requeue_subject_of,
    schedule_headers,
    schedule_subject,
    stream_of,
)
from mega.drivers.nats.receiver import NatsReceiver, requeue_headers
from mega.drivers.nats.records import (
    NO_MESSAGE,
    ensure_buckets,
    list_bucket,
    read_record,
    send_records,
    write_records,
)
from mega.errors import DependencyUnavailable, JobError

logger = logging.getLogger("mega.jobqueue")
# What a message's headers may take of the server's max_payload: ids and keys (200 characters
# each at most), times, a trace context.
HEADER_ROOM_BYTES = 4096

# How long a batch of events (the outbox relay's) waits for its PubAcks before it gives up
# (the rows stay pending). On SQLite writers wait for the relay's transaction meanwhile.
EVENTS_TIMEOUT_S = 2.0
# JetStream's answer to a publish whose Nats-Msg-Id an earlier publish still being stored
# carries: a duplicate, not a failure (the first one's message is the job).
DUPLICATE_IN_PROCESS = 10158
# Setting a lane up asks this many times when JetStream answers late (a cluster electing
# leaders, or busy making replicas), this long apart, before NATS counts as unavailable.
ENSURE_ATTEMPTS = 3
ENSURE_PAUSE_S = 0.5
# Broker-side message schedules (delayed jobs, scheduled retries) exist since this nats-server.
SCHEDULES_SINCE = (2, 12)
# A commit that added outbox rows in another process says so here (core NATS, fire and
# forget), so relays wake at once wherever the row was written; their poll is the fallback.
WAKE_SUBJECT = "mega.outbox.wake"


class NatsBus:
    """A bus on NATS JetStream: `native` is the nats-py client (reconnecting forever), `js`
    its one JetStreamContext (its async-publish inbox is made once)."""

    driver: ClassVar[str] = "nats"
    fair_lanes: ClassVar[bool] = True
    priority_lanes: ClassVar[bool] = True

    def __init__(
        self, alias: str, spec: BusSpec, client: NatsClient, watch: Reconnects | None = None
    ) -> None:
        self.alias = alias
        self.spec = spec
        self.native: NatsClient = client
        self.watch = watch or Reconnects()
        self.js: JetStreamContext = client.jetstream()
        self.acks = AckMux(client)  # pipelined writes of records (see acks.py)
        self._events_max_age_s: float | None = None
        self._apply_limits: dict[Lane, bool] = {}
        self._max_ack_pending: dict[Lane, int | None] = {}  # what each lane's consumer runs with

    @classmethod
    async def connect(cls, alias: str, spec: BusSpec) -> Self:
        watch = Reconnects()
        return cls(alias, spec, await connect_nats(alias, str(spec.url), watch), watch)

    @property
    def disconnects(self) -> int:
        """Times the connection was lost (a node went away or went silent) since connecting."""
        return self.watch.disconnects

    @property
    def url(self) -> str:
        return str(self.spec.url)

    @property
    def connected(self) -> bool:
        return bool(self.native.is_connected)

    @property
    def max_body_bytes(self) -> int:
        """The largest body a publish may carry: the server's `max_payload` (1 MB unless set
        otherwise) less room for mega's headers, which count in it."""
        return int(self.native.max_payload) - HEADER_ROOM_BYTES

    @property
    def schedules_supported(self) -> bool:
        """Whether the connected nats-server has message schedules (2.12+)."""
        version = self.native.connected_server_version
        return (version.major, version.minor) >= SCHEDULES_SINCE

    async def close(self) -> None:
        self.watch.closing = True
        with contextlib.suppress(Exception):
            await self.native.drain()

    def on_lost(self, callback: Callable[[str], None]) -> None:
        """Call `callback(reason)` if the connection is closed for good other than by `close`
        (the host then exits for its supervisor to start it again)."""
        self.watch.when_lost.append(callback)

    async def ping(self) -> None:
        if not self.native.is_connected:
            raise DriverUnavailable("disconnected")
        try:
            await self.native.flush(timeout=1)
        except NATS_ERRORS as exc:
            raise DriverUnavailable(str(exc) or type(exc).__name__) from exc

    # -- lanes --------------------------------------------------------------------------------

    async def ensure(self, lane: Lane, *, apply_limits: bool) -> None:
        """The lane's streams, record buckets and durable consumer, where missing. An existing
        consumer keeps its limits (ack wait, max_ack_pending) and a bucket its keep unless
        `apply_limits`: a difference is said in one line (see `ensure_consumer`)."""
        self._apply_limits[lane] = apply_limits
        for attempt in range(1, ENSURE_ATTEMPTS + 1):
            try:
                await self._ensure_once(lane, apply_limits)
                return
            except (NatsTimeoutError, NoRespondersError) as exc:
                # A cluster electing leaders, or busy creating replicas, answers late: the
                # steps are idempotent, so ask again before calling NATS unavailable.
                if attempt == ENSURE_ATTEMPTS:
                    raise DriverUnavailable(str(exc) or type(exc).__name__) from exc
                logger.info("%s: JetStream answered late (%s); asking again", lane.name, exc)
                await asyncio.sleep(ENSURE_PAUSE_S)
            except NATS_ERRORS as exc:
                raise DriverUnavailable(str(exc) or type(exc).__name__) from exc

    async def _ensure_once(self, lane: Lane, apply_limits: bool) -> None:
        """One pass of `ensure`: the job stream, the dead letters, the record buckets (of the
        tables whose keep is above 0), the consumer."""
        if lane.kind == "job":
            await ensure_stream(self.js, StreamConfig(
                name=stream_of(lane),
                subjects=[lane.subject, f"{lane.subject}.{DELAY_TOKEN}.*"],
                retention=RetentionPolicy.WORK_QUEUE,
                storage=StorageType.FILE,
                duplicate_window=DEDUP_WINDOW_S,
                allow_msg_schedules=True if self.schedules_supported else None,
                num_replicas=lane.replicas,
            ))  # fmt: skip
        if lane.turns:
            await ensure_stream(self.js, StreamConfig(
                name=fair_stream_of(lane),
                subjects=[fair_subjects_of(lane)],
                retention=RetentionPolicy.LIMITS,
                storage=StorageType.FILE,
                duplicate_window=DEDUP_WINDOW_S,
                allow_direct=True,
                num_replicas=lane.replicas,
            ))  # fmt: skip
        await ensure_dlq_stream(self.js, dlq_stream_config(lane))
        await ensure_buckets(self.js, lane, apply_limits=apply_limits)
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
        """Make a lane's streams and consumer exist again (a JetStream that lost them)."""
        if lane.kind == "group" and self._events_max_age_s is not None:
            await self.ensure_events(max_age_s=self._events_max_age_s)
        await self.ensure(lane, apply_limits=self._apply_limits.get(lane, False))

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
                (fair_subject(lane, lane.turn_key(m)), body, headers) if m.run_at_ms is None
                else (subject, body, headers)
                for m, (subject, body, headers) in zip(messages, envelopes, strict=True)
            ]  # fmt: skip
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

    # -- dead letters -------------------------------------------------------------------------

    async def dead_letters(
        self, lane: Lane, *, limit: int, before: int | None = None
    ) -> list[DlqRecord]:
        """Newest first, from the stream's last sequence (or `before` - 1) down: a page is
        `limit` gets by sequence sent at once, then more for the ones deleted (requeued)."""
        stream = dlq_stream_of(lane)
        try:
            state = (await self.js.stream_info(stream)).state
        except NATS_ERRORS as exc:
            raise DriverUnavailable(str(exc) or type(exc).__name__) from exc
        top = state.last_seq if before is None else min(state.last_seq, before - 1)
        records: list[DlqRecord] = []
        while len(records) < limit and top >= max(state.first_seq, 1):
            seqs = range(top, max(top - (limit - len(records)), state.first_seq - 1, 0), -1)
            found = await asyncio.gather(*(self._record_at(stream, seq) for seq in seqs))
            records.extend(record for record in found if record is not None)
            top = seqs[-1] - 1
        return records[:limit]

    async def dead_letter(self, lane: Lane, job_id: str) -> DlqRecord | None:
        """The last message on the id's subject (`dlq_record_subject`): one look-up. Records
        stored before that subject existed are looked for on the bare subject, only when the
        stream still holds some there."""
        stream = dlq_stream_of(lane)
        try:
            raw = await self.js.get_last_msg(stream, dlq_record_subject(lane, job_id))
            return _dlq_record(raw)
        except NotFoundError:
            pass
        except NATS_ERRORS as exc:
            raise DriverUnavailable(str(exc) or type(exc).__name__) from exc
        return await self._legacy_dead_letter(lane, job_id)

    async def _legacy_dead_letter(self, lane: Lane, job_id: str) -> DlqRecord | None:
        stream, bare = dlq_stream_of(lane), dlq_subject_of(lane)
        try:
            info = await self.js.stream_info(stream, subjects_filter=bare)
            if not (info.state.subjects or {}).get(bare):
                return None
            found: DlqRecord | None = None
            seq = info.state.first_seq
            while True:
                try:
                    raw = await self.js.get_msg(stream, seq=seq, subject=bare, next=True)
                except NotFoundError:
                    return found
                record = _dlq_record(raw)
                if record is not None and record["id"] == job_id:
                    found = record  # the newest wins
                seq = (raw.seq or seq) + 1
        except NATS_ERRORS as exc:
            raise DriverUnavailable(str(exc) or type(exc).__name__) from exc

    async def delete_dead(self, lane: Lane, seq: int) -> bool:
        try:
            return bool(await self.js.delete_msg(dlq_stream_of(lane), seq))
        except NotFoundError:
            return False
        except APIError as exc:
            if exc.err_code == NO_MESSAGE:
                return False
            raise DriverUnavailable(str(exc) or type(exc).__name__) from exc
        except NATS_ERRORS as exc:
            raise DriverUnavailable(str(exc) or type(exc).__name__) from exc

    async def _record_at(self, stream: str, seq: int) -> DlqRecord | None:
        """The record at `seq`, None when deleted (requeued), expired or not one of ours."""
        try:
            return _dlq_record(await self.js.get_msg(stream, seq))
        except NotFoundError:
            return None
        except NATS_ERRORS as exc:
            raise DriverUnavailable(str(exc) or type(exc).__name__) from exc

    async def count_dead(self, lane: Lane) -> int:
        try:
            return int((await self.js.stream_info(dlq_stream_of(lane))).state.messages)
        except NATS_ERRORS as exc:
            raise DriverUnavailable(str(exc) or type(exc).__name__) from exc

    async def requeue(self, lane: Lane, record: DlqRecord) -> None:
        stream, seq = dlq_stream_of(lane), record["seq"]
        headers = requeue_headers(lane, record["id"], _name(record["subject"]),
                                  record.get("first_enqueued_at"), _now_ms())  # fmt: skip
        # A requeue retried after a lost PubAck must not publish the job twice.
        headers[NATS_MSG_ID] = f"{record['id']}:requeue:{stream}:{seq}"
        if "flow_key" in record:
            headers[HEADER_FLOW_KEY] = record["flow_key"]
        body = json.dumps(record["payload"], separators=(",", ":")).encode()
        try:
            # A new message starts at num_delivered 1: that is the attempt reset.
            await self.js.publish(requeue_subject_of(lane), body, headers=headers)
            await self.js.delete_msg(stream, seq)
        except NATS_ERRORS as exc:
            raise DriverUnavailable(str(exc) or type(exc).__name__) from exc

    async def purge(self, lane: Lane) -> int:
        stream = dlq_stream_of(lane)
        try:
            before = (await self.js.stream_info(stream)).state.messages
            await self.js.purge_stream(stream)
        except NATS_ERRORS as exc:
            raise DriverUnavailable(str(exc) or type(exc).__name__) from exc
        return int(before)

    # -- records ------------------------------------------------------------------------------

    async def put_records(
        self, lane: Lane, table: Table, records: Sequence[tuple[str, bytes]], *, create: bool,
        confirm: bool = True,
    ) -> list[bool]:  # fmt: skip
        """Publish each record onto its key's subject in the lane's bucket (see records.py);
        unconfirmed ones as plain publishes, which JetStream stores without answering. A table
        kept 0 s has no bucket: nothing is written, and nothing will be read."""
        if not records or lane.keep_s(table) <= 0:
            return [True] * len(records)
        self._check_connected()
        bucket = bucket_of(lane, table)
        try:
            if not confirm:
                return await send_records(self.native, bucket, records, create=create)
            return await write_records(self.js, self.acks, bucket, records, create=create)
        except DriverUnavailable as exc:
            raise DriverUnavailable(
                f"{lane.name}: cannot store its {table} records in bucket {bucket}: {exc}"
            ) from exc

    async def get_records(
        self, lane: Lane, table: Table, keys: Sequence[str]
    ) -> list[bytes | None]:
        """One request per key, all sent before any answer is awaited."""
        if lane.keep_s(table) <= 0:
            return [None] * len(keys)
        bucket = bucket_of(lane, table)
        try:
            return list(await asyncio.gather(*(read_record(self.js, bucket, key) for key in keys)))
        except DriverUnavailable as exc:
            raise DriverUnavailable(
                f"{lane.name}: cannot read its {table} records in bucket {bucket}: {exc}"
            ) from exc

    async def list_records(self, lane: Lane, table: Table) -> list[tuple[str, bytes]]:
        """The table's bucket is the lane's own (the "workers" one holds a key per consume
        loop): its subjects from one stream info, then each one's last message."""
        bucket = bucket_of(lane, table)
        try:
            return await list_bucket(self.js, bucket)
        except DriverUnavailable as exc:
            raise DriverUnavailable(
                f"{lane.name}: cannot list its {table} records in bucket {bucket}: {exc}"
            ) from exc

    # -- events -------------------------------------------------------------------------------

    async def ensure_events(self, *, max_age_s: float) -> None:
        self._events_max_age_s = max_age_s
        try:
            await ensure_stream(self.js, StreamConfig(
                name=EVENTS_STREAM,
                subjects=[EVENT_PREFIX + ">", REQUEUE_PREFIX + ">"],
                retention=RetentionPolicy.LIMITS,
                storage=StorageType.FILE,
                max_age=max_age_s or None,
                duplicate_window=DEDUP_WINDOW_S,
                # A group's retries wait as schedules on `events_requeue.<group>._delay.*`.
                allow_msg_schedules=True if self.schedules_supported else None,
                num_replicas=self.spec.replicas,
            ))  # fmt: skip
        except NATS_ERRORS as exc:
            raise DriverUnavailable(str(exc) or type(exc).__name__) from exc

    async def emit(self, messages: Sequence[Message], *, max_age_s: float) -> list[bool]:
        self._check_connected()
        envelopes = [
            (EVENT_PREFIX + m.subject, m.body,
             {NATS_MSG_ID: m.id, HEADER_EMITTED_AT: str(m.enqueued_at_ms), **(m.trace or {})})
            for m in messages
        ]  # fmt: skip
        return await self.publish_envelopes(envelopes, timeout_s=EVENTS_TIMEOUT_S)

    async def watch_commits(self, wake: Callable[[], None]) -> Callable[[], Awaitable[None]]:
        async def woken(msg: Msg) -> None:
            wake()

        try:
            subscription = await self.native.subscribe(WAKE_SUBJECT, cb=woken)
        except NATS_ERRORS:  # not connected now: the relay polls meanwhile
            return _not_watching

        async def unsubscribe() -> None:
            with contextlib.suppress(*NATS_ERRORS):
                await subscription.unsubscribe()

        return unsubscribe

    def announce_commit(self) -> None:
        async def publish() -> None:
            with contextlib.suppress(*NATS_ERRORS):
                await self.native.publish(WAKE_SUBJECT, b"")

        _fire_and_forget(publish())

    # -- publishing ---------------------------------------------------------------------------

    def _check_connected(self) -> None:
        # While reconnecting, nats-py buffers publishes and sends them once back: a publish
        # that timed out would then still be stored. Refusing up front keeps "raised" meaning
        # "not stored" (but for a drop in mid-flight: give an id to make retries safe).
        if not self.native.is_connected:
            raise DriverUnavailable(f"NATS bus {self.alias!r} is not connected")

    async def publish_envelopes(
        self, envelopes: list[tuple[str, bytes, dict[str, str]]], timeout_s: float | None = None
    ) -> list[bool]:
        """Publish and wait for every PubAck; True each one stored, False a duplicate id (also
        one whose first publish is still in process: the message is the first's, not lost)."""
        if len(envelopes) == 1:
            subject, body, headers = envelopes[0]
            try:
                return [stored(await self.js.publish(subject, body, headers=headers))]
            except MaxPayloadError as exc:
                raise MessageTooLarge(self.native.max_payload) from exc
            except NATS_ERRORS as exc:
                return [stored(exc)]
        futures: list[asyncio.Future[Any]] = []
        try:
            for subject, body, headers in envelopes:
                futures.append(await self.js.publish_async(subject, body, headers=headers))
            if timeout_s is None:
                timeout_s = BULK_TIMEOUT_S + BULK_TIMEOUT_PER_MSG_S * len(envelopes)
            # asyncio.timeout, not wait_for: a stop that cancels this task then takes the
            # gather's CancelledError itself (wait_for left it unretrieved, and logged).
            async with asyncio.timeout(timeout_s):
                acks = await asyncio.gather(*futures, return_exceptions=True)
        except MaxPayloadError as exc:  # raised before it is sent: the earlier ones may stand
            for future in futures:
                future.cancel()
            raise MessageTooLarge(self.native.max_payload) from exc
        except NATS_ERRORS as exc:
            for future in futures:
                future.cancel()  # frees nats-py's in-flight slot of an ack that never came
            raise DriverUnavailable(str(exc) or type(exc).__name__) from exc
        return [stored(answer) for answer in acks]


def stored(answer: PubAck | BaseException) -> bool:
    """What JetStream answered one publish: True stored, False a duplicate id (also one whose
    first publish is still being stored: the first's message is the job, nothing failed);
    DriverUnavailable for anything else."""
    if isinstance(answer, APIError) and answer.err_code == DUPLICATE_IN_PROCESS:
        return False
    if isinstance(answer, BaseException):
        raise DriverUnavailable(str(answer) or type(answer).__name__) from answer
    return not answer.duplicate


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


async def ensure_stream(js: JetStreamContext, config: StreamConfig) -> None:
    """Create a stream unless it exists; an existing one is never changed (its limits are the
    operator's). Safe to race with other processes."""
    assert config.name is not None
    try:
        await js.stream_info(config.name)
        return
    except NotFoundError:
        pass
    try:
        await js.add_stream(config)
    except APIError as exc:
        # A peer may have created it between our look-up and our create.
        try:
            await js.stream_info(config.name)
        except NotFoundError:
            raise JobError(
                f"cannot create stream {config.name} on {config.subjects}: {exc.description}",
                code="job.stream_conflict",
            ) from exc


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
                "apply_limits = True in the config, to change them)", change,
            )  # fmt: skip
            wanted = dataclasses.replace(
                wanted, ack_wait=have.ack_wait, max_ack_pending=have.max_ack_pending
            )
    fields = ("ack_wait", "max_ack_pending", "filter_subject", "filter_subjects")
    if not all(getattr(have, name) == getattr(wanted, name) for name in fields):
        # Without an action the server creates, or updates the editable fields in place.
        await js.add_consumer(stream, wanted)
    return wanted.max_ack_pending


async def ensure_dlq_stream(js: JetStreamContext, config: StreamConfig) -> None:
    """`ensure_stream`, and an existing dead-letter stream made before records were stored by
    job id given that subject too (a subject added, no limit changed)."""
    assert config.name is not None and config.subjects is not None
    try:
        have = (await js.stream_info(config.name)).config
    except NotFoundError:
        await ensure_stream(js, config)
        return
    missing = [subject for subject in config.subjects if subject not in (have.subjects or [])]
    if missing:
        logger.info("%s: storing dead letters by job id too (%s)", config.name, missing)
        subjects = [*(have.subjects or []), *missing]
        await js.update_stream(dataclasses.replace(have, subjects=subjects))


def dlq_stream_config(lane: Lane) -> StreamConfig:
    """A dead-letter stream: limits retention, kept `dlq_max_age_s` (0: forever), optional byte
    cap, `replicas` copies in a cluster."""
    max_age_s = lane.dlq_max_age_s
    return StreamConfig(
        num_replicas=lane.replicas,
        name=dlq_stream_of(lane),
        # Records on `<dlq subject>.<job id's key>`; the bare subject held those of before.
        subjects=[dlq_subject_of(lane), dlq_subject_of(lane) + ".>"],
        retention=RetentionPolicy.LIMITS,
        storage=StorageType.FILE,
        max_age=max_age_s or None,
        max_bytes=lane.dlq_max_bytes,
        # The server refuses a dedup window longer than max_age.
        duplicate_window=min(DEDUP_WINDOW_S, max_age_s) if max_age_s else DEDUP_WINDOW_S,
    )


class Reconnects:
    """What happens to one NATS client's connection: disconnects counted, and what must run
    again on the new connection (each receiver's `resettle`)."""

    def __init__(self) -> None:
        self.disconnects = 0
        self.server = "its server"  # host:port of the node the client is on
        self.hooks: set[Callable[[], Awaitable[None]]] = set()
        self.tried: dict[str, float] = {}  # host:port -> when last tried or lost (monotonic)
        self.closing = False  # set by our own close: the client's end is then no news
        self.when_lost: list[Callable[[str], None]] = []  # told if it is closed for good

    def lost(self) -> None:
        self.disconnects += 1
        self.tried[self.server] = time.monotonic()

    def choose(self, servers: list[Server], _info: dict[str, Any]) -> tuple[Server, float]:
        """The node to try next: the one least recently tried, the node just lost counting as
        tried at that moment, so it comes last (a frozen server still accepts TCP, a cut one
        does not answer, and either would hold the attempt for the whole connect timeout).
        A node tried within NATS_RECONNECT_WAIT_S is tried again only after that pause."""
        best = min(servers, key=lambda server: self.tried.get(server.uri.netloc, -math.inf))
        now = time.monotonic()
        delay_s = max(
            0.0, NATS_RECONNECT_WAIT_S - (now - self.tried.get(best.uri.netloc, -math.inf))
        )
        self.tried[best.uri.netloc] = now + delay_s  # tried when the pause ends
        return best, delay_s

    def closed(self, reason: str) -> None:
        """The client is closed and will not reconnect (the server refused something it sent
        with an -ERR, which nats-py ends the connection on): every receiver on it is stuck."""
        if self.closing:
            return
        logger.error("NATS connection closed for good (%s): nothing more is received", reason)
        for callback in self.when_lost:
            callback(reason)

    async def reconnected(self) -> None:
        for hook in list(self.hooks):
            try:
                await hook()
            except Exception:  # one receiver's trouble never keeps the others from theirs
                logger.exception("after a NATS reconnect")


async def connect_nats(alias: str, url: str, watch: Reconnects | None = None) -> NatsClient:
    """A client that reconnects forever, after a bounded check that some node answers. It
    pings every NATS_PING_INTERVAL_S, so a silent node is left within seconds."""
    client = NatsClient()
    watch = watch or Reconnects()

    async def disconnected() -> None:
        if not (client.is_closed or client.is_draining):  # our own shutdown is not news
            watch.lost()
            logger.warning("NATS %r lost %s; moving to another node", alias, watch.server)

    async def reconnected() -> None:
        watch.server = _server_of(client)
        logger.info("NATS %r reconnected to %s", alias, watch.server)
        await watch.reconnected()

    async def error(exc: Exception) -> None:
        logger.debug("NATS %r: %s", alias, exc)

    async def closed() -> None:
        watch.closed(str(client.last_error or "closed by the server"))

    try:
        # nats-py retries the *first* connect forever too when reconnects are unlimited, so
        # reachability is checked with a bounded probe first and the connect itself is capped.
        servers = url.split(",")  # a cluster: any node will do, the client learns the others
        await _probe_any(servers)
        # Shuffled once here, so that processes spread over the nodes; after losing one the
        # client picks the next with `watch.choose`, never the one it just lost first.
        connect = client.connect(
            servers=random.sample(servers, len(servers)),
            dont_randomize=True,
            reconnect_to_server_handler=watch.choose,
            name=f"mega:{alias}",
            connect_timeout=int(CONNECT_TIMEOUT_S),
            allow_reconnect=True,
            max_reconnect_attempts=-1,  # forever: a NATS restart is an outage, not a crash
            reconnect_time_wait=NATS_RECONNECT_WAIT_S,  # type: ignore[arg-type]  # float s works
            ping_interval=NATS_PING_INTERVAL_S,
            max_outstanding_pings=NATS_MAX_OUTSTANDING_PINGS,
            disconnected_cb=disconnected,
            reconnected_cb=reconnected,
            error_cb=error,
            closed_cb=closed,
        )
        await asyncio.wait_for(connect, CONNECT_TIMEOUT_S * 2)
        watch.server = _server_of(client)
        return client
    except Exception as exc:
        raise DependencyUnavailable(
            "nats", f"cannot reach NATS {alias!r} at {url} ({_reason(exc)}); {HOW_TO_GET_SERVICES}"
        ) from exc


async def _probe_any(urls: list[str]) -> None:
    """Return once one of `urls` accepts a TCP connection; raise the last error otherwise."""
    error: BaseException = OSError("no URL")
    for url in urls:
        parts = urlsplit(url)
        try:
            _reader, writer = await asyncio.wait_for(
                asyncio.open_connection(parts.hostname, parts.port or 4222), CONNECT_TIMEOUT_S
            )
        except (OSError, TimeoutError) as exc:
            error = exc
            continue
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()
        return
    raise error


def _server_of(client: NatsClient) -> str:
    url = client.connected_url
    return url.netloc if url is not None else "its server"


def _reason(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _dlq_record(raw: RawStreamMsg) -> DlqRecord | None:
    """A dead-letter message's record with its `seq`; None for a message not one of ours."""
    if raw.data is None:
        return None
    try:
        record: DlqRecord = json.loads(raw.data)
    except ValueError:
        return None
    record["seq"] = int(raw.seq or 0)
    return record


def _name(subject: str) -> str:
    # Records written before the drivers moved named an event `events.<name>`.
    return subject.removeprefix(EVENT_PREFIX)


def _now_ms() -> int:
    return int(time.time() * 1000)


_background: set[asyncio.Task[None]] = set()  # keeps fire-and-forget tasks alive


def _fire_and_forget(coro: Coroutine[Any, Any, None]) -> None:
    task = asyncio.get_running_loop().create_task(coro)
    _background.add(task)
    task.add_done_callback(_background.discard)


async def _not_watching() -> None:
    return None
