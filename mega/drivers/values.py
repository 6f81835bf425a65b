"""The values that cross the bus interface (mega/drivers/base.py): a `Lane`, a `Message` going
in, a `Delivery` coming out, a lane's `LaneStats`, a dead letter's `DlqRecord`, the priority
bands, the two errors a driver raises, and the helpers the engines without headers or subject
filters share.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any, Literal, TypedDict

# A message id given by the caller (or an outbox row's) is dropped as a duplicate when the bus
# saw it within this many seconds (JetStream's default duplicate window; every driver keeps it).
DEDUP_WINDOW_S = 120


class DlqErrorInfo(TypedDict):
    type: str
    message: str


class _DlqRecordBase(TypedDict):
    id: str
    subject: str
    payload: Any
    error: DlqErrorInfo
    attempts: int
    first_enqueued_at: int | None
    failed_at: int
    worker: str


class DlqRecord(_DlqRecordBase, total=False):
    """One dead letter, the same JSON object on every driver (times in epoch ms):

        {"id", "subject", "payload", "error": {"type", "message"}, "attempts",
         "first_enqueued_at", "failed_at", "worker"}

    `raw_b64`: the body of a message that was not JSON (then `payload` is None). `flow_key`:
    the key the job was enqueued with, when it had one (a requeue keeps it). `seq`: where the
    driver keeps it (a stream sequence, a row id), added when records are listed."""

    raw_b64: str
    flow_key: str
    seq: int


# A prioritized lane's bands (`Message.priority`), highest first, and the turns they take while
# each has jobs waiting: high 6 of every 10, normal 3, low 1, a weighted share that never
# starves low. A turn whose band has none waiting goes to the highest band that has some.
Priority = Literal["high", "normal", "low"]
PRIORITIES: tuple[Priority, ...] = ("high", "normal", "low")
PRIORITY_TURNS: tuple[Priority, ...] = (
    "high",
    "normal",
    "high",
    "high",
    "low",
    "high",
    "normal",
    "high",
    "high",
    "normal",
)


def band_of_turn(turn: int, waiting: Callable[[Priority], bool]) -> Priority | None:
    """The band whose job goes at `turn` (a counter that each job taken moves on): the band
    PRIORITY_TURNS gives it when `waiting(band)`, else the highest band waiting; None: none is."""
    band = PRIORITY_TURNS[turn % len(PRIORITY_TURNS)]
    if waiting(band):
        return band
    return next((band for band in PRIORITIES if waiting(band)), None)


# The record stores of a lane: each job's status record, the values its runs returned, and
# the presence record of each consume loop on it (mega/lanes/presence.py).
Table = Literal["status", "result", "workers"]
# How long a "workers" record lives after its last write (a loop writes its own every 5 s).
WORKERS_KEEP_S = 30.0


@dataclass(frozen=True)
class Lane:
    """What one consume loop works on, as a driver needs to know it.

    `kind` "job": the queue of job subject `subject`; "group": listener group `name` over the
    bus's events, hearing the event names that match `subject` (a pattern: `*` one token,
    `>` the rest). `concurrency` caps the deliveries a process runs at once (on NATS, the whole
    group's), `ack_wait_s` is how long a delivery may go unsettled before another worker gets
    it (running ones are extended every third of it). The rest is how long and how much of the
    lane's dead letters are kept, and copies of its data in a cluster. `keep_status_s` and
    `keep_result_s` (0: none kept) are how long a record of the lane's record stores lives after
    its last write (see `Bus.put_records`). `fair`: deliveries are handed out round-robin across
    the messages' `flow_key`s (a driver whose `fair_lanes` is False is never given one).
    `prioritized`: deliveries take the turns of the messages' `priority` bands (PRIORITY_TURNS;
    a driver whose `priority_lanes` is False is never given one). A lane is one or the other,
    or neither: both keep jobs apart until their turn, by key or by band (`turn_key`).
    `durable`: `publish` returns only once the jobs would survive the loss of the server that
    took them. Where an acknowledged write is already replicated or on disk (a JetStream
    stream's quorum, a PostgreSQL commit) it changes nothing; on Redis, whose replication is
    asynchronous, it adds a WAIT for one replica (mega/drivers/redis/core.py)."""

    kind: Literal["job", "group"]
    name: str
    subject: str
    concurrency: int
    ack_wait_s: float
    dlq_max_age_s: float
    dlq_max_bytes: int | None = None
    replicas: int = 1
    keep_status_s: float = 0
    keep_result_s: float = 0
    fair: bool = False
    prioritized: bool = False
    durable: bool = False

    @property
    def turns(self) -> bool:
        """Whether its jobs wait apart until their turn (a fair or a prioritized lane)."""
        return self.fair or self.prioritized

    def turn_key(self, message: Message) -> str | None:
        """What a job of a lane with `turns` waits under: its band on a prioritized lane, its
        key on a fair one."""
        return message.priority if self.prioritized else message.flow_key

    def keep_s(self, table: Table) -> float:
        """How long a record of `table` lives after its last write (0: the table is off)."""
        if table == "workers":
            return WORKERS_KEEP_S
        return self.keep_status_s if table == "status" else self.keep_result_s


@dataclass(frozen=True)
class Message:
    """One job or event to store. `subject` is a job's subject or an event's name. `body` is
    the JSON payload. `dedup`: `id` was given by the caller (or is an outbox row's), so a
    second message with it within the driver's dedup window is dropped. `run_at_ms`: hold it
    until then (None: now). `trace`: the trace context headers (mega.tracing) that every
    driver stores with the message and hands back on its deliveries. `flow_key`: the key the
    job was enqueued with (a tenant, a customer), for its rate limit and its cap per key;
    stored with the message and handed back on its deliveries likewise. `priority`: its band
    on a prioritized lane (`Lane.prioritized`; stored with the message, ignored elsewhere)."""

    id: str
    subject: str
    body: bytes
    enqueued_at_ms: int
    run_at_ms: int | None = None
    dedup: bool = True
    trace: dict[str, str] | None = None
    flow_key: str | None = None
    priority: Priority = "normal"


@dataclass(frozen=True)
class LaneStats:
    """A lane at an instant. `pending`: stored, not yet delivered (delayed ones included where
    the engine counts them); `in_flight`: delivered and not yet settled; `dlq`: dead letters.

    `oldest_ms`: when (epoch ms) the oldest message that is stored and not settled yet was
    first enqueued (or emitted): waiting or running; a delayed job or a retry that is not due
    yet is left out where the engine makes that cheap (each driver says what it counts); None
    when there is none. `stored`: how many messages the lane ever stored, a counter that only
    grows (each driver says what it counts), for rates. Read in the same call as the counts,
    at the price of one or two more round trips at most, never a scan of the lane. Neither
    takes part in equality: two reads of a lane compare by their counts. `approximate`: the
    counts are an estimate (an engine where counting a deep lane exactly means reading all of
    it, such as postgres, estimates past a depth it says)."""

    pending: int
    in_flight: int
    dlq: int
    oldest_ms: int | None = field(default=None, compare=False)
    stored: int = field(default=0, compare=False)
    approximate: bool = field(default=False, compare=False)


@dataclass(slots=True)
class Delivery:
    """One delivery of a message to this process, as a receiver hands it to the consume loop.

    `attempt` counts every delivery of the job so far, this one included, across crashes and
    retries (the engine's delivery count plus the attempts made before a retry's copy).
    `key` is the same for every redelivery of this very message (a stream sequence, a row id),
    so the loop can remember what it could not report. `handle` is the engine's own message,
    for the receiver alone. `trace`: the message's trace context headers; the consume loop
    sets it before a `retry`, whose copy carries it. `flow_key`: the message's (a retry's copy
    keeps it). Made once per delivery on the hot path,
    so not frozen."""

    id: str
    subject: str
    body: bytes
    attempt: int
    enqueued_at_ms: int | None
    run_at_ms: int | None
    key: Hashable
    handle: Any
    trace: dict[str, str] | None = None
    flow_key: str | None = None


class MessageTooLarge(Exception):
    """The engine refuses a message this large (a NATS server's `max_payload`, headers
    included): not an outage, since the same message is refused again. `limit` is the
    engine's cap in bytes. Nothing was stored."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"over the engine's message cap ({limit:,} bytes, headers included)")
        self.limit = limit


class DriverUnavailable(Exception):
    """The engine did not answer (down, restarting, partitioned): the caller may try again.
    A driver raises it from every primitive whose failure the framework must handle; the
    framework turns it into DependencyUnavailable, a retry or a redelivery."""


def trace_headers(stored: str | bytes | None) -> dict[str, str] | None:
    """A message's trace context headers as an engine without headers keeps them (JSON text:
    a Redis stream field, a PostgreSQL column), or None for none or anything else."""
    if not stored:
        return None
    try:
        found = json.loads(stored)
    except ValueError:
        return None
    return found if isinstance(found, dict) else None


def pattern_matcher(pattern: str) -> Callable[[str], bool]:
    """A test of event names against a listener group's pattern, with the NATS wildcards (`*`
    one dot-separated token, a final `>` one or more), for the engines that cannot filter."""
    regex = r"\.".join(
        "[^.]+" if token == "*" else ".+" if token == ">" else re.escape(token)
        for token in pattern.split(".")
    )
    compiled = re.compile(regex)
    return lambda name: compiled.fullmatch(name) is not None
