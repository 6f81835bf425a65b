"""The dead letters of a NATS lane: a stream of their own per lane (`<stream>_dlq`), each record
on its job id's subject so one look-up finds it (see names.py)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import time

from nats.js import JetStreamContext
from nats.js.api import (
    RawStreamMsg,
    RetentionPolicy,
    StorageType,
    StreamConfig,
)
from nats.js.errors import APIError, NotFoundError

from mega.drivers.base import (
    DEDUP_WINDOW_S,
    DlqRecord,
    DriverUnavailable,
    Lane,
)
from mega.drivers.nats.core import NatsCore, ensure_stream
from mega.drivers.nats.errors import NATS_ERRORS
from mega.drivers.nats.names import (
    EVENT_PREFIX,
    HEADER_FLOW_KEY,
    NATS_MSG_ID,
    dlq_record_subject,
    dlq_stream_of,
    dlq_subject_of,
    requeue_subject_of,
)
from mega.drivers.nats.records import (
    NO_MESSAGE,
)
from mega.drivers.nats.settle import requeue_headers

logger = logging.getLogger("mega.jobqueue")


class NatsDeadLetters(NatsCore):
    """The `DeadLetterStore` part of the NATS bus."""

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
        headers = requeue_headers(
            lane, record["id"], _name(record["subject"]), record.get("first_enqueued_at"), _now_ms()
        )
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
