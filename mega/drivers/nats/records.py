"""The nats driver's record stores: a JetStream key-value bucket per lane and table.

A bucket (names in names.py) keeps one message per key (history 1) for the lane's keep after
its last write (the bucket's max_age): a write is a publish onto `$KV.<bucket>.<key>`, which
replaces the key's message and so restarts its clock. A create-only write carries
`Nats-Expected-Last-Subject-Sequence: 0`, so JetStream itself refuses it when the key has a
message, atomically however many processes race. An expired record leaves no message (these
buckets have no limit markers), so a create may take its key again.

A delete marker (`nats kv del` by an operator, or a bucket someone gave limit markers) is a
message too: a read sees no record in it, and a create refused because of one writes over it,
as nats-py's own `KeyValue.create` does.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
from collections.abc import Sequence
from typing import Any

from nats.aio.client import Client as NatsClient
from nats.js import JetStreamContext
from nats.js.api import KeyValueConfig, RawStreamMsg, StorageType
from nats.js.errors import APIError, NotFoundError

from mega.drivers.base import DEDUP_WINDOW_S, DriverUnavailable, Lane, Table
from mega.drivers.nats.acks import BULK_TIMEOUT_PER_MSG_S, BULK_TIMEOUT_S, AckMux, Envelope
from mega.drivers.nats.core import NatsCore
from mega.drivers.nats.errors import NATS_ERRORS
from mega.drivers.nats.names import (
    BUCKET_STREAM_PREFIX,
    BUCKET_SUBJECT_PREFIX,
    HEADER_KV_OPERATION,
    HEADER_MARKER_REASON,
    NATS_EXPECTED_LAST_SUBJECT_SEQ,
    bucket_of,
    job_id_of,
    record_subject,
)
from mega.errors import JobError

logger = logging.getLogger("mega.jobqueue")

# A lane's record stores, each a bucket of its own (made when its keep is above 0).
TABLES: tuple[Table, ...] = ("status", "result", "workers")
# JetStream's answer to a publish whose expected last subject sequence is not the subject's:
# for a create (expected 0), the key has a message.
KEY_EXISTS = 10071
# JetStream's "no message found" (a key never written, or expired), beside "stream not found".
NO_MESSAGE = 10037


def bucket_config(lane: Lane, table: Table) -> KeyValueConfig:
    """The bucket of a lane's `table`: one message per key, kept the lane's keep after its
    last write, on file, `replicas` copies in a cluster. Direct gets let `nats kv get` read
    any replica; the driver reads from the leader (see `read_record`)."""
    return KeyValueConfig(
        bucket=bucket_of(lane, table),
        description=f"mega: the {table} records of {lane.name}",
        history=1,
        ttl=lane.keep_s(table),
        storage=StorageType.FILE,
        replicas=lane.replicas,
        direct=True,
    )


async def ensure_buckets(js: JetStreamContext, lane: Lane, *, apply_limits: bool) -> None:
    """The buckets of the lane's tables whose keep is above 0 (see `ensure_bucket`)."""
    for table in TABLES:
        if lane.keep_s(table) > 0:
            await ensure_bucket(js, lane, table, apply_limits=apply_limits)


async def ensure_bucket(
    js: JetStreamContext, lane: Lane, table: Table, *, apply_limits: bool
) -> None:
    """Create the bucket of a lane's `table` unless it exists (safe to race). An existing one
    whose keep differs from the lane's gets the lane's only with `apply_limits`; otherwise the
    difference is said in one line and its keep stays, as with a consumer's limits."""
    wanted = bucket_config(lane, table)
    stream = BUCKET_STREAM_PREFIX + wanted.bucket
    try:
        have = (await js.stream_info(stream)).config
    except NotFoundError:
        try:
            await js.create_key_value(wanted)
            return
        except APIError as exc:
            # A peer may have created it between our look-up and our create (with another
            # keep, the server refuses ours): compare with theirs.
            try:
                have = (await js.stream_info(stream)).config
            except NotFoundError:
                raise JobError(
                    f"cannot create the {table} records bucket {wanted.bucket} of {lane.name}: "
                    f"{exc.description}",
                    code="job.stream_conflict",
                ) from exc
    keep_s = lane.keep_s(table)
    running_s = have.max_age or 0.0
    if math.isclose(running_s, keep_s, abs_tol=0.001):
        return
    change = (
        f"{lane.name}: its {table} records bucket {wanted.bucket} keeps a record "
        f"{running_s:g} s, the lane declares {keep_s:g} s"
    )
    if not apply_limits:
        logger.warning(
            "%s: keeping the running keep (start with --apply-limits, or set apply_limits = "
            "True in the config, to change it)",
            change,
        )
        return
    logger.info("%s: applying the declared keep (--apply-limits)", change)
    # The server refuses a dedup window longer than max_age (records carry no msg id anyway).
    window_s = min(have.duplicate_window or DEDUP_WINDOW_S, DEDUP_WINDOW_S, keep_s)
    await js.update_stream(dataclasses.replace(have, max_age=keep_s, duplicate_window=window_s))


async def write_records(
    js: JetStreamContext,
    mux: AckMux,
    bucket: str,
    records: Sequence[tuple[str, bytes]],
    *,
    create: bool,
) -> list[bool]:
    """Publish each record onto its key's subject, in order; `create`: only onto a key with no
    message. True each one stored, False a create refused. Raises DriverUnavailable."""
    headers = {NATS_EXPECTED_LAST_SUBJECT_SEQ: "0"} if create else None
    envelopes = [(record_subject(bucket, key), value, headers) for key, value in records]
    kept = await _publish(mux, envelopes)
    for index, (subject, value, _) in enumerate(envelopes):
        if not kept[index]:  # one by one, in order: of two creates of one key, the first wins
            last = await _last_message(js, bucket, subject)
            if last is not None and last.seq is not None and is_marker(last.headers):
                over = {NATS_EXPECTED_LAST_SUBJECT_SEQ: str(last.seq)}
                kept[index] = (await _publish(mux, [(subject, value, over)]))[0]
    return kept


async def send_records(
    nc: NatsClient, bucket: str, records: Sequence[tuple[str, bytes]], *, create: bool
) -> list[bool]:
    """Publish each record onto its key's subject without asking for an answer: JetStream
    stores it (a create only onto a key with no message) and says nothing. All True: what
    became of each is not known here. Raises DriverUnavailable when the connection fails."""
    headers = {NATS_EXPECTED_LAST_SUBJECT_SEQ: "0"} if create else None
    try:
        for key, value in records:
            await nc.publish(record_subject(bucket, key), value, headers=headers)
    except NATS_ERRORS as exc:
        raise DriverUnavailable(str(exc) or type(exc).__name__) from exc
    return [True] * len(records)


async def read_record(js: JetStreamContext, bucket: str, job_id: str) -> bytes | None:
    """The value of a job id's record, None when there is none (or a delete marker). Asked of
    the bucket's leader, not by a direct get (which any replica answers, maybe before it has
    the latest write): a read after a write sees it, in a cluster too."""
    last = await _last_message(js, bucket, record_subject(bucket, job_id))
    if last is None or is_marker(last.headers):
        return None
    return last.data or b""


async def list_bucket(js: JetStreamContext, bucket: str) -> list[tuple[str, bytes]]:
    """Every record of a bucket: the subjects the stream holds (one stream info, filtered on
    the bucket's subjects), then each one's last message, asked all at once. For a small
    bucket (a lane's workers: one key per consume loop)."""
    stream = BUCKET_STREAM_PREFIX + bucket
    prefix = f"{BUCKET_SUBJECT_PREFIX}{bucket}."
    try:
        info = await js.stream_info(stream, subjects_filter=prefix + ">")
    except NotFoundError as exc:
        raise DriverUnavailable(f"no stream {stream}: {exc.description}") from exc
    except NATS_ERRORS as exc:
        raise DriverUnavailable(str(exc) or type(exc).__name__) from exc
    subjects = list(info.state.subjects or {})
    found = await asyncio.gather(*(_last_message(js, bucket, subject) for subject in subjects))
    return [
        (job_id_of(subject.removeprefix(prefix)), last.data or b"")
        for subject, last in zip(subjects, found, strict=True)
        if last is not None and not is_marker(last.headers)
    ]


def written(answer: dict[str, Any]) -> bool:
    """What JetStream answered one record's publish: True stored, False a create refused
    because the key has a message; DriverUnavailable for any other error."""
    error = answer.get("error")
    if error is None:
        return True
    if error.get("err_code") == KEY_EXISTS:
        return False
    raise DriverUnavailable(str(error.get("description") or error))


def is_marker(headers: dict[str, str] | None) -> bool:
    """Whether a key's message is a delete marker rather than a record."""
    if not headers:
        return False
    return headers.get(HEADER_KV_OPERATION) in ("DEL", "PURGE") or HEADER_MARKER_REASON in headers


async def _publish(mux: AckMux, envelopes: list[Envelope]) -> list[bool]:
    """Publish pipelined (see acks.py) and read each answer with `written`."""
    timeout_s = BULK_TIMEOUT_S + BULK_TIMEOUT_PER_MSG_S * len(envelopes)
    return [written(answer) for answer in await mux.publish(envelopes, timeout_s=timeout_s)]


async def _last_message(js: JetStreamContext, bucket: str, subject: str) -> RawStreamMsg | None:
    """The last message on `subject` in a bucket, None when there is none. A bucket that is
    not there (the lane was never ensured, or JetStream lost it) is DriverUnavailable."""
    try:
        return await js.get_last_msg(BUCKET_STREAM_PREFIX + bucket, subject)
    except NotFoundError as exc:
        if exc.err_code == NO_MESSAGE:
            return None
        raise DriverUnavailable(
            f"no stream {BUCKET_STREAM_PREFIX}{bucket}: {exc.description}"
        ) from exc
    except NATS_ERRORS as exc:
        raise DriverUnavailable(str(exc) or type(exc).__name__) from exc


class NatsRecordStore(NatsCore):
    """The `RecordStore` part of the NATS bus."""

    async def put_records(
        self,
        lane: Lane,
        table: Table,
        records: Sequence[tuple[str, bytes]],
        *,
        create: bool,
        confirm: bool = True,
    ) -> list[bool]:
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
