"""What a `memory` bus holds (`bus.native`): a queue per job subject and per listener group,
the dedup window and the events a new group replays. mega.testing reaches in here: `busy()`,
`fast_forward()`, every lane's queue (`subjects`), and `MemoryLane.dead_letter`, the one place
dead letters are stored (its `failing_dlq` makes it raise)."""

from __future__ import annotations

import asyncio
import itertools
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from mega import clock
from mega.clock import Timer
from mega.drivers.base import (
    DEDUP_WINDOW_S,
    PRIORITIES,
    DlqRecord,
    Lane,
    LaneStats,
    Priority,
    band_of_turn,
)

# Events a memory bus keeps for listener groups that start later (the oldest go first).
EVENTS_KEPT = 100_000
# Ids the dedup window holds before it forgets those that left the window.
DEDUP_KEPT = 100_000
# A lane's record store drops its expired records whenever it holds more than this many.
RECORDS_SWEPT_AT = 100_000

_keys = itertools.count(1)


@dataclass
class MemoryMessage:
    """One stored job or event of one lane. `deliveries` counts its deliveries since `base`
    was set: a retry keeps the message, sets `base` to the attempts made and starts counting
    again, so a delivery's attempt is `base + deliveries`."""

    job_id: str
    subject: str  # a job's subject, or an event's name
    body: bytes
    enqueued_at_ms: int
    run_at_ms: int
    deliveries: int = 0
    base: int = 0
    key: int = field(default_factory=lambda: next(_keys))  # the same for every redelivery
    trace: dict[str, str] | None = None
    flow_key: str | None = None
    priority: Priority = "normal"


# An emitted event as groups to come replay it: name, id, body, emitted at ms, trace headers.
KeptEvent = tuple[str, str, bytes, int, dict[str, str] | None]


class FairReady:
    """The ready messages of a fair lane: a queue per key, and the keys that have some in the
    order they take turns. `popleft` takes the oldest message of the key whose turn it is and
    sends that key to the back; a message handed back (`appendleft`) is its key's next, and that
    key's turn is now. Messages without a key are one key of their own."""

    def __init__(self) -> None:
        self.queues: dict[str | None, deque[MemoryMessage]] = {}
        self.turns: deque[str | None] = deque()  # the keys with messages, next turn first
        self.count = 0

    def append(self, message: MemoryMessage) -> None:
        self._queue_of(message.flow_key).append(message)

    def appendleft(self, message: MemoryMessage) -> None:
        queue = self._queue_of(message.flow_key)
        queue.appendleft(message)
        self.turns.remove(message.flow_key)
        self.turns.appendleft(message.flow_key)

    def popleft(self) -> MemoryMessage:
        key = self.turns.popleft()
        queue = self.queues[key]
        message = queue.popleft()
        self.count -= 1
        if queue:
            self.turns.append(key)
        else:
            del self.queues[key]
        return message

    def _queue_of(self, key: str | None) -> deque[MemoryMessage]:
        self.count += 1
        queue = self.queues.get(key)
        if queue is None:
            queue = self.queues[key] = deque()
            self.turns.append(key)
        return queue

    def __len__(self) -> int:
        return self.count

    def __iter__(self) -> Iterator[MemoryMessage]:
        for queue in self.queues.values():
            yield from queue


class PriorityReady:
    """The ready messages of a prioritized lane: a queue per band, taken in the bands' turns
    (PRIORITY_TURNS). A message handed back (`appendleft`) is its band's next, and the turn it
    took is given back."""

    def __init__(self) -> None:
        self.queues: dict[Priority, deque[MemoryMessage]] = {band: deque() for band in PRIORITIES}
        self.turn = 0

    def append(self, message: MemoryMessage) -> None:
        self.queues[message.priority].append(message)

    def appendleft(self, message: MemoryMessage) -> None:
        self.queues[message.priority].appendleft(message)
        self.turn -= 1

    def popleft(self) -> MemoryMessage:
        band = band_of_turn(self.turn, lambda band: bool(self.queues[band]))
        if band is None:
            raise IndexError("pop from an empty PriorityReady")
        self.turn += 1
        return self.queues[band].popleft()

    def __len__(self) -> int:
        return sum(map(len, self.queues.values()))

    def __iter__(self) -> Iterator[MemoryMessage]:
        for queue in self.queues.values():
            yield from queue


@dataclass
class MemoryLane:
    """One lane's queue (a job subject's, a listener group's): ready messages (round-robin
    across keys on a fair lane: FairReady; by band on a prioritized one: PriorityReady),
    scheduled ones (`timers`), the ones delivered and not settled (`taken`), dead letters."""

    ready: deque[MemoryMessage] | FairReady | PriorityReady = field(default_factory=deque)
    scheduled: int = 0  # delayed jobs and retries waiting for their time
    taken: dict[int, MemoryMessage] = field(default_factory=dict)  # delivered, by key
    stored: int = 0  # messages ever stored (a retry or a hand-back is the same message)
    dead: list[DlqRecord] = field(default_factory=list)  # in `seq` order
    dead_ids: dict[str, int] = field(default_factory=dict)  # job id -> its newest record's seq
    wakeup: asyncio.Event = field(default_factory=asyncio.Event)
    seq: int = 0
    timers: dict[Timer, Callable[[], None]] = field(default_factory=dict)

    @property
    def running(self) -> int:
        return len(self.taken)

    def stats(self) -> LaneStats:
        """`oldest_ms`: the earliest enqueue of the ready and the running messages (a look at
        each: memory is for tests); `stored`: every new message put, delayed ones included."""
        unsettled = [*self.ready, *self.taken.values()]
        oldest = min((m.enqueued_at_ms for m in unsettled), default=None)
        return LaneStats(
            pending=len(self.ready) + self.scheduled,
            in_flight=self.running,
            dlq=len(self.dead),
            oldest_ms=oldest,
            stored=self.stored,
        )

    def take(self, message: MemoryMessage) -> None:
        """A message delivered: running until `settle`."""
        self.taken[message.key] = message

    def settle(self, message: MemoryMessage) -> None:
        self.taken.pop(message.key, None)

    def put(self, message: MemoryMessage, *, at_ms: int | None = None, first: bool = False) -> None:
        """Ready now (`first`: ahead of the others), or at `at_ms` (epoch ms) without holding
        anything while it waits."""
        if message.deliveries == 0 and message.base == 0:
            self.stored += 1  # new: never delivered, not a retry's
        delay_s = 0.0 if at_ms is None else (at_ms - clock.now() * 1000) / 1000
        if delay_s <= 0:
            self._ready(message, first=first)
            return
        self.scheduled += 1

        def due() -> None:
            del self.timers[timer]
            self.scheduled -= 1
            self._ready(message)

        timer = clock.current().call_later(delay_s, due)
        self.timers[timer] = due

    def dead_letter(self, record: DlqRecord) -> None:
        """Keep a dead letter: the DLQ publish of the other drivers (mega.testing's
        failing_dlq makes it raise, to test what a failed publish does)."""
        self.seq += 1
        record["seq"] = self.seq
        self.dead.append(record)
        self.dead_ids[record["id"]] = self.seq

    def drop_dead(self, index: int) -> None:
        """Delete the dead letter at `index` of `dead` (and its entry in `dead_ids`)."""
        record = self.dead.pop(index)
        if self.dead_ids.get(record["id"]) == record.get("seq"):
            del self.dead_ids[record["id"]]

    def fast_forward(self) -> None:
        """Make every waiting message due now (mega.testing's drain: no real sleeps)."""
        for timer, due in list(self.timers.items()):
            timer.cancel()
            due()

    @property
    def busy(self) -> bool:
        return bool(self.ready or self.scheduled or self.running)

    def _ready(self, message: MemoryMessage, *, first: bool = False) -> None:
        if first:
            self.ready.appendleft(message)
        else:
            self.ready.append(message)
        self.wakeup.set()


class MemoryBroker:
    """The queues of a memory bus's job subjects and listener groups (`subjects`, by queue
    name: a job's subject, `group:<group>` for a listener group), the dedup window, and the
    events log new groups replay."""

    def __init__(self) -> None:
        self.subjects: dict[str, MemoryLane] = {}
        self.dedup: dict[str, float] = {}  # id -> when it leaves the dedup window (monotonic)
        # Emitted events, oldest first, for groups to come.
        self.events: deque[tuple[str, str, bytes, int, dict[str, str] | None]] = deque(
            maxlen=EVENTS_KEPT
        )
        # Listener groups: group -> (its pattern's test of an event name, its queue's name).
        self.groups: dict[str, tuple[Callable[[str], bool], str]] = {}
        # The lanes' record stores: (queue name, table) -> key -> (value, expires, monotonic s).
        self.records: dict[tuple[str, str], dict[str, tuple[bytes, float]]] = {}

    def table(self, lane: Lane, table: str) -> dict[str, tuple[bytes, float]]:
        """One record store of a lane, its expired records dropped now and then."""
        records = self.records.setdefault((queue_name(lane), table), {})
        if len(records) > RECORDS_SWEPT_AT:
            now = clock.monotonic()
            for key in [key for key, (_, expires) in records.items() if expires <= now]:
                del records[key]
        return records

    def subject(self, name: str) -> MemoryLane:
        """The queue called `name`, made empty when missing."""
        found = self.subjects.get(name)
        if found is None:
            found = self.subjects[name] = MemoryLane()
        return found

    def lane(self, lane: Lane) -> MemoryLane:
        """The queue of a lane: a job's subject, a group's `group:<name>`."""
        found = self.subject(queue_name(lane))
        kind = FairReady if lane.fair else PriorityReady if lane.prioritized else None
        if kind is not None and not isinstance(found.ready, kind):
            ready = kind()
            for message in found.ready:
                ready.append(message)
            found.ready = ready
        return found

    def queues(self) -> list[MemoryLane]:
        """Every lane's queue."""
        return list(self.subjects.values())

    def busy(self) -> bool:
        """Anything ready, running or waiting for its time, on any lane."""
        return any(lane.busy for lane in self.subjects.values())

    def fast_forward(self) -> None:
        """Make every waiting retry and delayed message due now."""
        for lane in list(self.subjects.values()):
            lane.fast_forward()

    def seen(self, message_id: str) -> bool:
        """True when this id was stored within the dedup window (then it is dropped)."""
        now = clock.monotonic()
        expires = self.dedup.get(message_id)
        if expires is not None and expires > now:
            return True
        self.dedup[message_id] = now + DEDUP_WINDOW_S
        if len(self.dedup) > DEDUP_KEPT:  # bounded: forget what left the window
            self.dedup = {key: when for key, when in self.dedup.items() if when > now}
        return False


def queue_name(lane: Lane) -> str:
    return lane.subject if lane.kind == "job" else f"group:{lane.name}"  # no `:` in a subject
