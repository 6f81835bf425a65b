"""Dead letters: the record, its publish, and the tools to read, requeue and purge them.

A job whose tries are exhausted (or that cannot be decoded, or that killed its worker too often)
is published as one JSON record to `<subject>.dlq`, in the limits-retention stream
`MEGA_JOBS_<subject>_DLQ` (kept `dlq_max_age_s`, 7 days by default):

    {"id", "subject", "payload", "error": {"type", "message"}, "attempts",
     "first_enqueued_at", "failed_at", "worker"}            (times in epoch ms)

An undecodable message has `payload: null` and its body in `raw_b64`.

    tools = queue.dlq                                         # a DeadLetters over the queue
    records = await tools.list(EmailJob, limit=20)          # newest first
    await tools.requeue(EmailJob, records[0]["id"])          # back onto demo.email, attempts reset
    await tools.purge(EmailJob)
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any, Protocol, TypedDict

from nats.js.errors import NotFoundError

from mega.errors import JobError
from mega.jobs.job import NATS_MSG_ID

if TYPE_CHECKING:
    from nats.js import JetStreamContext


class DlqRecordError(TypedDict):
    type: str
    message: str


class _DlqRecordBase(TypedDict):
    id: str
    subject: str
    payload: Any
    error: DlqRecordError
    attempts: int
    first_enqueued_at: int | None
    failed_at: int
    worker: str


class DlqRecord(_DlqRecordBase, total=False):
    """One DLQ record. `raw_b64` only for a message whose body was not JSON; `seq` (the DLQ
    stream sequence) is added by `DeadLetters.list`."""

    raw_b64: str
    seq: int


def make_record(
    subject: str,
    job_id: str,
    payload: Any,
    error_type: str,
    error_message: str,
    *,
    attempts: int,
    first_enqueued_at: int | None,
    worker: str,
    raw: bytes | None = None,
) -> DlqRecord:
    """Build a DLQ record; `raw` (a body that could not be decoded) is kept as base64."""
    record = DlqRecord(
        id=job_id,
        subject=subject,
        payload=payload,
        error=DlqRecordError(type=error_type, message=error_message),
        attempts=attempts,
        first_enqueued_at=first_enqueued_at,
        failed_at=int(time.time() * 1000),
        worker=worker,
    )
    if raw is not None:
        record["raw_b64"] = base64.b64encode(raw).decode("ascii")
    return record


async def publish_record(
    js: JetStreamContext, dlq_subject: str, record: DlqRecord, *, seq: int
) -> None:
    """Publish a record to a DLQ stream's subject and wait for the PubAck (raises NATS errors).

    The dedup id is keyed on `seq`, the work-stream sequence of the failed message: a retried
    publish of that message dedups, while the same job requeued (a new message) and failing
    again gets a record of its own."""
    headers = {NATS_MSG_ID: f"{record['id']}:dlq:{seq}"}
    await js.publish(dlq_subject, json.dumps(record).encode(), headers=headers)


class DlqSpec(Protocol):
    """What the DLQ tools need to know of a job (JobSpec) or a listener group (ListenerSpec)."""

    @property
    def name(self) -> str: ...
    @property
    def dlq_stream(self) -> str: ...
    @property
    def requeue_subject(self) -> str: ...  # where a requeued record is published

    def requeue_headers(self, record: DlqRecord) -> dict[str, str]:
        """The headers of the message a requeue publishes (attempts restart at 1)."""
        ...


class DeadLetters:
    """DLQ tools over one bus (a JobQueue's `dlq`, an EventBus's `dlq`). Meant for operators
    and status pages: each call reads the stream message by message, fine for thousands of
    records, not for millions.

    `ensure(cls)` makes sure the streams of a Job (or Listener) class exist and returns its
    spec."""

    def __init__(
        self, js: JetStreamContext, ensure: Callable[[type[Any]], Awaitable[DlqSpec]]
    ) -> None:
        self.js = js
        self.ensure = ensure

    async def count(self, job_cls: type[Any]) -> int:
        """Records currently kept in the job's DLQ stream."""
        spec = await self.ensure(job_cls)
        info = await self.js.stream_info(spec.dlq_stream)
        return int(info.state.messages)

    async def list(self, job_cls: type[Any], limit: int = 50) -> list[DlqRecord]:
        """Up to `limit` records, newest first, each with its stream `seq`."""
        spec = await self.ensure(job_cls)
        records: list[DlqRecord] = []
        async for record in self._scan(spec, newest_first=True):
            if len(records) >= limit:
                break
            records.append(record)
        return records

    async def requeue(self, job_cls: type[Any], job_id: str) -> int:
        """Publish the record(s) with this job id back onto the job subject, attempts reset,
        then delete them from the DLQ. Returns how many were requeued (0: no such id)."""
        return await self._requeue(job_cls, job_id)

    async def requeue_all(self, job_cls: type[Any]) -> int:
        """Requeue every record of the job's DLQ; returns the count."""
        return await self._requeue(job_cls, None)

    async def purge(self, job_cls: type[Any]) -> int:
        """Delete every record of the job's DLQ; returns how many there were."""
        spec = await self.ensure(job_cls)
        before = (await self.js.stream_info(spec.dlq_stream)).state.messages
        await self.js.purge_stream(spec.dlq_stream)
        return int(before)

    async def _requeue(self, job_cls: type[Any], job_id: str | None) -> int:
        spec = await self.ensure(job_cls)
        requeued = 0
        async for record in self._scan(spec, newest_first=False):
            if job_id is not None and record["id"] != job_id:
                continue
            if "raw_b64" in record:
                # Republishing bytes that failed to decode would only dead-letter them again.
                raise JobError(
                    f"{spec.name}: DLQ record {record['id']} holds an undecodable body; "
                    "fix or purge it instead of requeueing",
                    code="job.not_requeueable",
                )
            seq = record["seq"]
            headers = {
                **spec.requeue_headers(record),
                # A requeue retried after a lost PubAck must not publish the job twice.
                NATS_MSG_ID: f"{record['id']}:requeue:{spec.dlq_stream}:{seq}",
            }
            body = json.dumps(record["payload"], separators=(",", ":")).encode()
            # A new message starts at num_delivered 1: that is the attempt reset.
            await self.js.publish(spec.requeue_subject, body, headers=headers)
            await self.js.delete_msg(spec.dlq_stream, seq)
            requeued += 1
        return requeued

    async def _scan(self, spec: DlqSpec, *, newest_first: bool) -> AsyncIterator[DlqRecord]:
        js = self.js
        state = (await js.stream_info(spec.dlq_stream)).state
        if state.messages == 0:
            return
        seqs = range(state.last_seq, state.first_seq - 1, -1)
        if not newest_first:
            seqs = range(state.first_seq, state.last_seq + 1)
        for seq in seqs:
            try:
                raw = await js.get_msg(spec.dlq_stream, seq)
            except NotFoundError:
                continue  # deleted (requeued) or expired in the meantime
            if raw.data is None:
                continue
            try:
                record: DlqRecord = json.loads(raw.data)
            except ValueError:
                continue  # not one of ours; leave it alone
            record["seq"] = seq
            yield record
