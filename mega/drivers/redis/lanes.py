"""Where a lane lives in Redis: its streams, consumer group, sorted set, dead letters and
records."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from redis.exceptions import ResponseError

from mega.drivers.base import PRIORITY_TURNS, DlqRecord, Lane, Table, pattern_matcher
from mega.drivers.redis.client import RedisClient
from mega.drivers.redis.scripts import (
    EVENT_SUBJECT_PREFIX,
    EVENTS_LOG,
    GROUP_PREFIX,
    JOB_GROUP,
    JOB_KEY_PREFIX,
)

Fields = dict[str, Any]  # an entry's fields, names decoded, values as Redis returned them (bytes)


@dataclass(frozen=True)
class LaneKeys:
    """The keys one lane works on. `stream` is read all the time; when `shared`, other consumer
    groups read it too (the events log), so its entries are acknowledged and never deleted.
    `own` is where the lane's retries come back and its DLQ requeues go (a job's own stream; a
    listener group's side stream, read at each housekeeping round). `accepts`, when given,
    picks the entries of `stream` to deliver; the others are acknowledged untouched (a group's
    event pattern: Redis cannot filter a stream for a consumer group)."""

    group: str
    stream: str
    own: str
    scheduled: str
    dlq: str
    shared: bool = False
    accepts: Callable[[str], bool] | None = None

    @property
    def dlq_index(self) -> str:
        """The hash of the lane's dead letters by job id: id -> entry id of its newest."""
        return self.dlq + ":ids"

    @property
    def streams(self) -> tuple[str, ...]:
        return (self.stream,) if self.own == self.stream else (self.stream, self.own)

    @property
    def fair_turns(self) -> str:
        """A fair lane's keys with jobs waiting, in turn order (scripts.FAIR_PUSH); on a
        prioritized lane, how many turns its bands took."""
        return self.own + ":fair:turns"

    @property
    def fair_count(self) -> str:
        """How many jobs of a fair (or prioritized) lane wait in its lists."""
        return self.own + ":fair:count"

    @property
    def fair_prefix(self) -> str:
        """The prefix of a fair lane's list of one key's jobs (+ the key; a prioritized lane's:
        + the band)."""
        return self.own + ":fair:key:"

    def dedup(self, message_id: str) -> str:
        """The key that marks a caller-given id as seen, for DEDUP_WINDOW_S."""
        return f"{self.stream}:dedup:{message_id}"

    def deletes(self, stream: str) -> bool:
        return not (self.shared and stream == self.stream)

    def record(self, table: Table, key: str) -> str:
        """The key of one record of the lane's `table`: `<own>:<table>:<job id>`."""
        return f"{self.own}:{table}:{key}"

    def record_index(self, table: Table) -> str:
        """The sorted set of a listed table's keys (`<own>:<table>`), scored by expiry ms."""
        return f"{self.own}:{table}"


def lane_keys(lane: Lane) -> LaneKeys:
    """A job lane's keys under its own hash tag; a listener group's, under the events side's
    (the log and every group's keys are read together by the scripts)."""
    if lane.kind == "job":
        key = JOB_KEY_PREFIX + "{" + lane.subject + "}"
        return LaneKeys(JOB_GROUP, key, key, key + ":scheduled", key + ":dlq")
    own = f"{EVENTS_LOG}:group:{lane.name}"
    return LaneKeys(
        group=GROUP_PREFIX + lane.name,
        stream=EVENTS_LOG,
        own=own,
        scheduled=own + ":scheduled",
        dlq=own + ":dlq",
        shared=True,
        accepts=pattern_matcher(lane.subject),
    )


def event_name(fields: Fields) -> str:
    """The event name of an entry of the events side (its `subject` field without `events.`)."""
    return as_text(fields.get("subject", b"")).removeprefix(EVENT_SUBJECT_PREFIX)


def as_text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


# A dead letter's `seq` is its entry id `<ms>-<n>` as ms * SEQ_PER_MS + n: unique, in the
# stream's order, and below 2**53 (exact in JSON and JavaScript) until the year 2255. The
# dead-letter stream takes one XADD per script call, far fewer than SEQ_PER_MS in one ms.
SEQ_PER_MS = 1000


def parse_record(entry_id: Any, fields: dict[Any, Any]) -> DlqRecord:
    """A dead letter as stored (one field `record`), with its `seq` (see SEQ_PER_MS)."""
    raw: Any = fields.get(b"record", fields.get("record"))
    record: DlqRecord = json.loads(raw)
    ms, _, n = as_text(entry_id).partition("-")
    record["seq"] = int(ms) * SEQ_PER_MS + int(n or 0)
    return record


def entry_of(seq: int) -> str:
    """The dead-letter entry id a `seq` stands for."""
    return f"{seq // SEQ_PER_MS}-{seq % SEQ_PER_MS}"


def turn_order(lane: Lane) -> str:
    """The bands' turns as the feed scripts read them on a prioritized lane (PRIORITY_TURNS as
    initials); "" on any other lane."""
    return "".join(band[0] for band in PRIORITY_TURNS) if lane.prioritized else ""


async def ensure_groups(redis: RedisClient, keys: LaneKeys) -> None:
    """The lane's consumer group on its streams, where missing (a new group starts at the
    oldest entry kept: a new listener group replays the events log)."""
    for stream in keys.streams:
        try:
            await redis.xgroup_create(stream, keys.group, id="0", mkstream=True)
        except ResponseError as exc:
            if "BUSYGROUP" not in str(exc):  # it exists already: fine
                raise


def read_entries(answer: Any) -> Iterator[tuple[Any, Any]]:
    """The (entry id, fields) of an XREADGROUP answer (RESP2: a list, RESP3: a dict)."""
    streams: Iterable[Any] = answer.items() if isinstance(answer, dict) else answer or []
    for item in streams:
        for entry_id, fields in item[1] or []:
            if fields:  # a deleted entry still pending comes back empty
                yield entry_id, fields


def int_or_none(value: Any) -> int | None:
    return None if value is None else int(value)


def text_or_none(value: Any) -> str | None:
    return None if value is None else as_text(value)
