"""The one interface every bus driver implements, and the values that cross it.

A driver is one engine (NATS JetStream, Redis Streams, PostgreSQL, this process's memory) seen
through the few primitives the framework needs; everything that is the same for every engine
(the consume loop, `decide()`, the signals, the DLQ record and tools, JobQueue, EventBus) is
written once above, in mega/jobs and mega/events, and never names an engine.

    bus = await NatsBus.connect("jobs", BusSpec(driver="nats", url="nats://127.0.0.1:4222"))
    await bus.ensure(lane, apply_limits=False)        # a job's queue, or a listener group
    [stored] = await bus.publish(lane, [message])     # False: a duplicate id, dropped
    receiver = bus.receiver(lane, consumer="worker@host:1")
    for delivery in await receiver.fetch(10): ...     # then ack / retry / dead_letter
    await bus.close()

A lane is what one consume loop works on: the queue of one job subject, or the cursor of one
listener group over the bus's events. A driver keeps what it needs per lane (streams, keys,
tables) under names of its own; the framework only hands it the `Lane`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any, ClassVar, Protocol, Self

from mega.drivers.receiving import Receiver
from mega.drivers.values import (
    DEDUP_WINDOW_S,
    PRIORITIES,
    PRIORITY_TURNS,
    WORKERS_KEEP_S,
    Delivery,
    DlqErrorInfo,
    DlqRecord,
    DriverUnavailable,
    Lane,
    LaneStats,
    Message,
    MessageTooLarge,
    Priority,
    Table,
    band_of_turn,
    pattern_matcher,
    trace_headers,
)
from mega.settings import BusSpec

__all__ = [
    "DEDUP_WINDOW_S",
    "PRIORITIES",
    "PRIORITY_TURNS",
    "WORKERS_KEEP_S",
    "Bus",
    "DeadLetterStore",
    "Delivery",
    "DlqErrorInfo",
    "DlqRecord",
    "DriverUnavailable",
    "EventLog",
    "Lane",
    "LaneStats",
    "Lanes",
    "Message",
    "MessageTooLarge",
    "Priority",
    "Receiver",
    "RecordStore",
    "Table",
    "band_of_turn",
    "pattern_matcher",
    "trace_headers",
]


class Lanes(Protocol):
    """The connection and the lanes: what every consume loop and every enqueue needs."""

    driver: ClassVar[str]
    # Whether it can consume a fair lane (`Lane.fair`): take work round-robin across keys
    # (every built-in driver can; a plugin's that cannot is refused a fair job).
    fair_lanes: ClassVar[bool] = False
    # Whether it can consume a prioritized lane (`Lane.prioritized`, PRIORITY_TURNS).
    priority_lanes: ClassVar[bool] = False
    alias: str
    spec: BusSpec

    @property
    def native(self) -> Any: ...

    @property
    def connected(self) -> bool:
        """Whether a publish can reach the engine now (the outbox relay waits while not)."""
        ...

    @classmethod
    async def connect(cls, alias: str, spec: BusSpec) -> Self:
        """Connect (bounded in time); DependencyUnavailable names the URL when it cannot.

        Args:
            alias: the bus alias (its key in the config's `services.buses`), kept as `alias`
                and named in the errors.
            spec: that alias's settings: the driver's name and `url`, where the engine is;
                kept as `spec`.
        """
        ...

    async def close(self) -> None:
        """Close the connection; never raises."""
        ...

    async def ping(self) -> None:
        """Raise DriverUnavailable unless the engine answers now (health checks)."""
        ...

    # -- lanes: jobs and listener groups --------------------------------------------------------

    async def ensure(self, lane: Lane, *, apply_limits: bool) -> None:
        """Make what the lane needs exist (idempotent, safe to race). Existing limits that
        differ from the lane's change only with `apply_limits`; otherwise said in one line.

        Args:
            lane: the job queue or listener group to set up, with its limits.
            apply_limits: True to bring what exists in line with the lane's limits (ack wait,
                concurrency, keeps), as the worker's `--apply-limits` asks; False to leave
                them as the operator set them.
        """
        ...

    async def publish(self, lane: Lane, messages: Sequence[Message]) -> list[bool]:
        """Store jobs on a job lane and return once every one is stored: True each one kept,
        False a duplicate id. Raises DriverUnavailable (some may have been stored).

        Args:
            lane: a job lane (`kind` "job"), made by `ensure`; events go through `emit`.
            messages: the jobs, in the order of the answer. One with `run_at_ms` waits until
                then; one with `dedup` whose id the bus stored within DEDUP_WINDOW_S seconds
                is dropped (False).
        """
        ...

    async def stats(self, lane: Lane) -> LaneStats:
        """The lane now, as the engine counts it. Raises DriverUnavailable.

        Args:
            lane: a job queue or listener group that `ensure` made (one that is missing may
                raise DriverUnavailable).
        """
        ...

    def receiver(self, lane: Lane, *, consumer: str) -> Receiver:
        """Consume the lane in this process; `consumer` names this process to the engine.

        Args:
            lane: the job queue or listener group to consume, made by `ensure`.
            consumer: this process's name, the endpoint's `instance_id` (such as
                "worker@host:1"), for the engines that name who holds a delivery (Redis adds
                a random suffix; NATS and memory do not use it).
        """
        ...


class DeadLetterStore(Protocol):
    """The dead letters of each lane: a receiver stores them (`Receiver.dead_letter`); these
    are the tools that read, requeue and delete them (`mega.lanes.dlq.DeadLetters`)."""

    async def dead_letters(
        self, lane: Lane, *, limit: int, before: int | None = None
    ) -> list[DlqRecord]:
        """Up to `limit` records, newest first, each with its `seq`; with `before`, only those
        whose `seq` is below it (the next page: `before` = the last one's seq). A range read
        of the engine's (never a scan from the newest), so page 1000 of 100,000 records costs
        what page 1 does.

        Args:
            lane: the job queue or listener group whose dead letters to read.
            limit: the most records to return (a page).
            before: a `seq`: only records below it (the last one's `seq` of the page before);
                None, the default: from the newest.
        """
        ...

    async def dead_letter(self, lane: Lane, job_id: str) -> DlqRecord | None:
        """The newest record of this job id, with its `seq` (None: none), found through the
        engine's index of records by id rather than a scan, where it has one.

        Args:
            lane: the job queue or listener group whose dead letters to search.
            job_id: the record's `id`: the job's id (the event's, on a listener group).
        """
        ...

    async def delete_dead(self, lane: Lane, seq: int) -> bool:
        """Delete one record by its `seq`; False when it was not there.

        Args:
            lane: the job queue or listener group the record belongs to.
            seq: the record's `seq`, as `dead_letters` or `dead_letter` returned it.
        """
        ...

    async def count_dead(self, lane: Lane) -> int:
        """How many dead letters the lane holds now.

        Args:
            lane: the job queue or listener group whose dead letters to count.
        """
        ...

    async def requeue(self, lane: Lane, record: DlqRecord) -> None:
        """Store the record's job (or event, for a group) on the lane again as a new message,
        its attempts starting again at 1, and delete the record (seq).

        Args:
            lane: the job queue or listener group the record belongs to and goes back to.
            record: a record as `dead_letters` or `dead_letter` returned it, with its `seq`
                (which names the one to delete); its `flow_key`, if any, goes with the job.
        """
        ...

    async def purge(self, lane: Lane) -> int:
        """Delete every dead letter of the lane; returns how many there were.

        Args:
            lane: the job queue or listener group whose dead letters to delete.
        """
        ...


class RecordStore(Protocol):
    """The records of a lane: a key-value store per table (`Table`), each record with an
    expiry: status records, results, presence, and the lane's pause and cancels."""

    async def put_records(
        self,
        lane: Lane,
        table: Table,
        records: Sequence[tuple[str, bytes]],
        *,
        create: bool,
        confirm: bool = True,
    ) -> list[bool]:
        """Store each (key, value) in the lane's `table`, in order, and return once every one
        is stored; it expires `lane.keep_s(table)` seconds after this write. `confirm` False:
        the engine may take them without answering (a driver that can returns once they are
        sent, all True), for records whose loss costs only themselves. `create`: store
        only keys that have no live record (True each one stored, False each one kept as it
        was); otherwise overwrite (all True). Keys are job ids (1 to 200 printable characters
        without spaces) or the framework's own keys, which hold a space. A table whose keep is
        0 is never written (`ensure` may skip it). Raises DriverUnavailable (some may have
        been stored).

        Args:
            lane: the job queue or listener group the records belong to; its `keep_s(table)`
                is their life.
            table: which of the lane's stores: "status", "result" or "workers".
            records: (key, value) pairs, in the order of the answer; the values are the
                framework's own bytes, stored as they are.
            create: True to store only the keys that have no live record; False to overwrite.
            confirm: False when no answer need be awaited (see above); True, the default, to
                return once the engine has confirmed every one.
        """
        ...

    async def get_records(
        self, lane: Lane, table: Table, keys: Sequence[str]
    ) -> list[bytes | None]:
        """The live value of each key in the lane's `table`, in order, None for one never
        stored or expired; in one round trip where the engine can. Raises DriverUnavailable.

        Args:
            lane: the job queue or listener group the records belong to.
            table: which of the lane's stores: "status", "result" or "workers".
            keys: the keys to read, in the order of the answer (none: []).
        """
        ...

    async def list_records(self, lane: Lane, table: Table) -> list[tuple[str, bytes]]:
        """Every live (key, value) of the lane's `table`, in no order. Meant for the small
        "workers" table alone (a record per consume loop): each driver lists a table in its
        cheapest way, which for a table of every job id would still be a long read. Raises
        DriverUnavailable.

        Args:
            lane: the job queue or listener group the records belong to.
            table: which of the lane's stores to list: "workers" (see above).
        """
        ...


class EventLog(Protocol):
    """The bus's events, which listener groups read as lanes, and the outbox's notifier."""

    async def ensure_events(self, *, max_age_s: float) -> None:
        """Make the events log exist, keeping events `max_age_s` (0: forever) for replay.

        Args:
            max_age_s: how long events are kept for replay, in seconds (0: forever); the
                EventBus's `max_age_s`, a week by default.
        """
        ...

    async def emit(self, messages: Sequence[Message], *, max_age_s: float) -> list[bool]:
        """Append events (subject: the event name) in order, each to every group whose pattern
        matches; True each one kept, False a duplicate id. Raises DriverUnavailable.

        Args:
            messages: the events, in the order of the answer; one whose `id` the log already
                has (at least within DEDUP_WINDOW_S seconds) is dropped (False), whatever its
                `dedup`.
            max_age_s: the keep given to `ensure_events`, in seconds (0: forever), for the
                engines that trim or prune the log as they append (Redis, PostgreSQL).
        """
        ...

    async def watch_commits(self, wake: Callable[[], None]) -> Callable[[], Awaitable[None]]:
        """Call `wake()` when another process announces outbox rows; returns the stop.

        Args:
            wake: a plain function of no arguments, called on the event loop; it should only
                wake its caller (the outbox relay's sets its wake-up event).
        """
        ...

    def announce_commit(self) -> None:
        """Tell relays elsewhere that outbox rows were committed (fire and forget)."""
        ...


class Bus(Lanes, DeadLetterStore, RecordStore, EventLog, Protocol):
    """A connected bus of one alias: `ctx.bus(alias)`, the four concerns a driver implements.
    `native` is the engine's own client (typed as such by each driver class), for the rare
    call the interface does not cover."""
