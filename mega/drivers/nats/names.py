"""What the nats driver keeps where: stream, subject, consumer and header names.

Per job subject `<s>`:
    MEGA_JOBS_<s>       work queue (file storage) on `<s>` and `<s>._delay.*`; one durable pull
                        consumer `mega_workers` shared by every worker process
    MEGA_JOBS_<s>_DLQ   limits retention on `<s>.dlq` (kept `dlq_max_age_s`, optional byte cap)
    MEGA_JOBS_<s>_FAIR  a fair job's jobs waiting for their key's turn, on `<s>._fair.<key>`
                        (limits retention, direct gets; see fair.py)
    MEGA_JOBS_<s>_STATUS, MEGA_JOBS_<s>_RESULT
                        key-value buckets (streams KV_<bucket>) of the lane's records, one key
                        per job id (see `record_key`), each kept the lane's keep after its
                        last write; made only when that keep is above 0
Per bus, the events:
    MEGA_EVENTS         limits retention on `events.>` (every event, as `events.<name>`) and
                        `events_requeue.>` (a group's retries and requeued events)
Per listener group `<g>`:
    mega_group_<g>      durable pull consumer on MEGA_EVENTS, filtered on the group's pattern
                        and on `events_requeue.<g>`
    MEGA_EVENTS_<G>_DLQ its dead letters, on `events_dlq.<g>`
    MEGA_EVENTS_<G>_STATUS, MEGA_EVENTS_<G>_RESULT   its records, as a job's
"""

from __future__ import annotations

import base64
import re
import uuid
from datetime import UTC, datetime

from mega.drivers.base import Lane, Table

# The one durable pull consumer every worker process of a job binds to.
JOB_CONSUMER = "mega_workers"
STREAM_PREFIX = "MEGA_JOBS_"
DLQ_STREAM_SUFFIX = "_DLQ"
# Delayed jobs and retries wait as broker-side schedules on `<target>._delay.<token>` (jobs
# may not use this token in their subjects).
DELAY_TOKEN = "_delay"
# A fair job's jobs wait for their key's turn on `<s>._fair.<key token>` (fair.py).
FAIR_TOKEN = "_fair"
FAIR_STREAM_SUFFIX = "_FAIR"
EVENTS_STREAM = "MEGA_EVENTS"
EVENT_PREFIX = "events."
# A group's retries and requeued events come back on `events_requeue.<group>`: that group only.
REQUEUE_PREFIX = "events_requeue."
GROUP_DLQ_PREFIX = "events_dlq."
GROUP_DLQ_STREAM_PREFIX = "MEGA_EVENTS_"
GROUP_CONSUMER_PREFIX = "mega_group_"
# A record bucket `<b>` is the stream KV_<b> on the subjects `$KV.<b>.<key>` (JetStream's
# key-value convention, so `nats kv` reads them too).
BUCKET_STREAM_PREFIX = "KV_"
BUCKET_SUBJECT_PREFIX = "$KV."
# A job id that is not a plain token is a record key as this prefix plus its UTF-8 in
# unpadded base64url; a plain token never starts with it, so either way decodes one way.
ENCODED_KEY_PREFIX = "="
PLAIN_KEY = re.compile(r"[A-Za-z0-9_-]+")

# Message headers (the body is the JSON payload alone). JetStream drops a second message with
# the same Nats-Msg-Id within the stream's dedup window.
NATS_MSG_ID = "Nats-Msg-Id"
# A record's publish is stored only when its key's last message has this sequence (0: none).
NATS_EXPECTED_LAST_SUBJECT_SEQ = "Nats-Expected-Last-Subject-Sequence"
# A key-value delete marker: written by a client (DEL or PURGE), or left by the server.
HEADER_KV_OPERATION = "KV-Operation"
HEADER_MARKER_REASON = "Nats-Marker-Reason"
HEADER_JOB_ID = "Mega-Job-Id"
# Epoch ms of the first enqueue (kept through delays, retries and DLQ requeues).
HEADER_ENQUEUED_AT = "Mega-Enqueued-At"
# Epoch ms from which it may run (delayed, retried or requeued); start latency counts from it.
HEADER_RUN_AT = "Mega-Run-At"
# The key a job was enqueued with (rate limits and caps per key).
HEADER_FLOW_KEY = "Mega-Flow-Key"
# On a retry's copy: the attempts made before it (the attempt is this plus the delivery count).
HEADER_ATTEMPTS = "Mega-Attempts"
# Events carry two headers only (four of them halved the relay's rate): the id as the dedup
# id, and when it was emitted. A requeued event, which has a dedup id of its own, also carries
# its id and name.
HEADER_EMITTED_AT = "Mega-Emitted-At"
HEADER_EVENT_ID = "Mega-Event-Id"
HEADER_EVENT_NAME = "Mega-Event-Name"


def sanitized(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9]", "_", name)


def stream_name(subject: str) -> str:
    """`MEGA_JOBS_<subject with every non-alphanumeric character as _>`."""
    return STREAM_PREFIX + sanitized(subject)


def dlq_stream_name(subject: str) -> str:
    return stream_name(subject) + DLQ_STREAM_SUFFIX


def fair_stream_of(lane: Lane) -> str:
    """The stream of a fair job's jobs waiting for their key's turn."""
    return stream_name(lane.subject) + FAIR_STREAM_SUFFIX


def fair_subjects_of(lane: Lane) -> str:
    """Every key's subject of a fair job (a wildcard)."""
    return f"{lane.subject}.{FAIR_TOKEN}.*"


def fair_subject(lane: Lane, key: str | None) -> str:
    """Where a fair job of `key` waits: its key as one subject token (see `record_key`; no
    key is the token `=`)."""
    return f"{lane.subject}.{FAIR_TOKEN}.{record_key(key or '')}"


def fair_wake_of(lane: Lane) -> str:
    """A plain (not stored) subject on which a publisher of fair jobs wakes the receivers."""
    return f"mega.fair_wake.{fair_stream_of(lane)}"


def stream_of(lane: Lane) -> str:
    """The stream a lane's messages live in."""
    return stream_name(lane.subject) if lane.kind == "job" else EVENTS_STREAM


def durable_of(lane: Lane) -> str:
    return JOB_CONSUMER if lane.kind == "job" else GROUP_CONSUMER_PREFIX + lane.name


def dlq_stream_of(lane: Lane) -> str:
    if lane.kind == "job":
        return dlq_stream_name(lane.subject)
    return GROUP_DLQ_STREAM_PREFIX + sanitized(lane.name).upper() + DLQ_STREAM_SUFFIX


def dlq_subject_of(lane: Lane) -> str:
    return lane.subject + ".dlq" if lane.kind == "job" else GROUP_DLQ_PREFIX + lane.name


def dlq_record_subject(lane: Lane, job_id: str) -> str:
    """Where a record of `job_id` is stored: the dead letters' subject + its key, so the
    newest record of an id is one look-up by subject."""
    return f"{dlq_subject_of(lane)}.{record_key(job_id)}"


def requeue_subject_of(lane: Lane) -> str:
    """Where a lane's retries and DLQ requeues come back."""
    return lane.subject if lane.kind == "job" else REQUEUE_PREFIX + lane.name


def filter_subjects_of(lane: Lane) -> list[str]:
    """What a group's consumer hears: the events of its pattern and its own requeued ones."""
    return [EVENT_PREFIX + lane.subject, REQUEUE_PREFIX + lane.name]


def bucket_of(lane: Lane, table: Table) -> str:
    """The key-value bucket of a lane's records, named as its dead letters' stream with the
    table instead of `DLQ` (`MEGA_JOBS_<s>_STATUS`, `MEGA_EVENTS_<G>_RESULT`)."""
    if lane.kind == "job":
        return f"{stream_name(lane.subject)}_{table.upper()}"
    return f"{GROUP_DLQ_STREAM_PREFIX}{sanitized(lane.name).upper()}_{table.upper()}"


def record_key(job_id: str) -> str:
    """A job id as a key-value key, which allows only `[-/_=.A-Za-z0-9]` in non-empty
    dot-separated tokens: an id of `[A-Za-z0-9_-]` as it is (readable in `nats kv get`), any
    other (dots, `*`, `:`, unicode...) as `=` + its UTF-8 in unpadded base64url."""
    if PLAIN_KEY.fullmatch(job_id):
        return job_id
    encoded = base64.urlsafe_b64encode(job_id.encode()).rstrip(b"=").decode()
    return ENCODED_KEY_PREFIX + encoded


def job_id_of(key: str) -> str:
    """The job id a record key stands for (`record_key` reversed)."""
    if not key.startswith(ENCODED_KEY_PREFIX):
        return key
    encoded = key.removeprefix(ENCODED_KEY_PREFIX)
    return base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4)).decode()


def record_subject(bucket: str, job_id: str) -> str:
    return f"{BUCKET_SUBJECT_PREFIX}{bucket}.{record_key(job_id)}"


def schedule_headers(target: str, due_ms: int) -> dict[str, str]:
    """The headers of a broker-side message schedule: publish onto `target` at `due_ms`."""
    due = datetime.fromtimestamp(due_ms / 1000, UTC)
    return {
        "Nats-Schedule": "@at " + due.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
        "Nats-Schedule-Target": target,
    }


def schedule_subject(target: str) -> str:
    """Where a schedule for `target` waits: the server keeps one schedule per subject, so each
    delayed message gets a subject of its own."""
    return f"{target}.{DELAY_TOKEN}.{uuid.uuid4().hex}"
