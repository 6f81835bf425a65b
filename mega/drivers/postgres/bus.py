"""The `postgres` bus driver: jobs and events as rows, for a team whose only server is PostgreSQL.

Tables (sql.py holds their DDL and every statement):
    mega_bus_jobs     one row per job waiting or running, and per event copied to a group; a
                      worker claims due rows with FOR UPDATE SKIP LOCKED and leases them for the
                      lane's ack wait; a row whose lease ran out (its worker died) is claimed
                      again by anyone; an ack deletes the row
    mega_bus_dead     the dead letters (the DLQ record as jsonb), per lane
    mega_bus_dedup    caller-given ids seen within the 120 s window, per lane
    mega_bus_events   the events log, append-only, kept `max_age_s`, one row per event id
    mega_bus_cursors  per listener group, the last event seq it copied into its lane
    mega_bus_records  the lanes' records (status, result), one row per job id, live until its
                      `expires_at`; expired rows are deleted by the receivers now and then

A listener group is a lane like a job's: its receivers first copy the new matching events past
the group's cursor into the jobs table under the group's lane (cursor row locked, so one
process copies each event once), then claim them like jobs: retries, leases and dead letters
are the same code.

Connections: one for publishing and the bus's other calls (`native`), one per receiver for its
claims and settles, one that LISTENs. A publish or an emit sends `pg_notify` in its own
transaction, so waiting receivers wake at its commit; they poll every POLL_S otherwise.

The tables come with the framework's migrations (`mega db upgrade`, revisions 0003 and 0006);
`ensure` and `ensure_events` create them too when missing (same DDL), so a bus on a database
nobody migrated still works.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, ClassVar, Self

import psycopg

from mega.config import BusSpec
from mega.constants import CLOSE_TASKS_S
from mega.drivers.base import (
    DlqRecord,
    DriverUnavailable,
    Lane,
    LaneStats,
    Message,
    Receiver,
    Table,
)
from mega.drivers.postgres import sql
from mega.drivers.postgres.common import Connection, lane_key, one_line, open_connection, redact
from mega.drivers.postgres.receiver import PostgresReceiver
from mega.errors import ConfigError, DependencyUnavailable
from mega.tasks import cancel_and_wait

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

logger = logging.getLogger("mega.drivers.postgres")

# How long the LISTEN connection waits before connecting again after losing the server.
LISTEN_RETRY_S = 1.0
# pg_advisory_xact_lock key of `ensure`: processes starting together create the tables once
# (racing CREATE TABLE IF NOT EXISTS can still fail on the catalog's unique index). "mgdl".
DDL_LOCK_KEY = 0x6D67646C


def job_body(record: DlqRecord) -> bytes:
    """The body of a dead letter's job: its raw bytes when it was not JSON, else its payload."""
    raw = record.get("raw_b64")
    if raw:
        return base64.b64decode(raw)
    return json.dumps(record["payload"], separators=(",", ":")).encode()


def stored_key(lane: Lane, flow_key: str | None) -> str | None:
    """The key a job's row carries: on a fair lane, FAIR_NO_KEY for a job without one, so that
    it takes its turns in the key index like any key (`_delivery` hands it back as None)."""
    return flow_key or sql.FAIR_NO_KEY if lane.fair else flow_key


def publish_params(lane: Lane, message: Message) -> dict[str, Any]:
    """A job's row; its `priority` only on a prioritized lane (NULL elsewhere: the rows a
    prioritized claim reads are then the only ones in its index, sql.BAND_INDEX_DDL)."""
    return {
        "lane": lane_key(lane),
        "job_id": message.id,
        "subject": message.subject,
        "body": message.body,
        "enqueued_at_ms": message.enqueued_at_ms,
        "run_at_ms": message.run_at_ms,
        "dedup": message.dedup,
        "trace": sql.trace_text(message.trace),
        "flow_key": stored_key(lane, message.flow_key),
        "priority": message.priority if lane.prioritized else None,
    }


class PostgresBus:
    """The bus on PostgreSQL: see the module's docstring."""

    driver: ClassVar[str] = "postgres"
    fair_lanes: ClassVar[bool] = True
    priority_lanes: ClassVar[bool] = True

    def __init__(self, alias: str, spec: BusSpec, connection: Connection, listen: Connection):
        self.alias = alias
        self.spec = spec
        self.url = str(spec.url)
        self._connection = connection
        # Every use of the publishing connection holds this: a transaction block must not
        # take in another coroutine's statement.
        self._lock = asyncio.Lock()
        self._schema_ready = False
        # Kept from ensure_events/emit: receivers prune the events log by it (0: forever).
        self.events_max_age_s = 0.0
        # NOTIFY payload -> the events of the receivers waiting on it.
        self._wakers: dict[str, set[asyncio.Event]] = {}
        self._commit_watchers: set[Callable[[], None]] = set()
        self._receivers: set[PostgresReceiver] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False
        self._listener = asyncio.create_task(self._listen_forever(listen), name="mega-pg-listen")

    # -- connection ---------------------------------------------------------------------------

    @property
    def native(self) -> Connection:
        return self._connection

    @property
    def connected(self) -> bool:
        return not (self._closed or self._connection.closed or self._connection.broken)

    @classmethod
    async def connect(cls, alias: str, spec: BusSpec) -> Self:
        url = str(spec.url)
        opened: list[Connection] = []
        try:
            for _ in range(2):  # publishing, LISTEN
                opened.append(await open_connection(url))
        except (psycopg.Error, OSError, TimeoutError) as exc:
            for connection in opened:
                await connection.close()
            message = f"cannot reach PostgreSQL {alias!r} at {redact(url)} ({one_line(exc)})"
            raise DependencyUnavailable("postgres", message) from exc
        return cls(alias, spec, opened[0], opened[1])

    async def close(self) -> None:
        self._closed = True
        await cancel_and_wait([self._listener], CLOSE_TASKS_S)
        if self._tasks:  # the last announcements leave
            await asyncio.wait(self._tasks, timeout=CLOSE_TASKS_S)
        for receiver in list(self._receivers):
            with contextlib.suppress(Exception):
                await receiver.close()
        with contextlib.suppress(Exception):
            await self._connection.close()

    async def ping(self) -> None:
        async with self._using("ping") as connection:
            await connection.execute("SELECT 1")

    @asynccontextmanager
    async def _using(self, what: str) -> AsyncIterator[Connection]:
        """The publishing connection, alone, reconnected when lost; its errors become
        DriverUnavailable naming `what`."""
        async with self._lock:
            try:
                if self._connection.closed or self._connection.broken:
                    self._connection = await open_connection(self.url)
                yield self._connection
            except (psycopg.Error, OSError, TimeoutError) as exc:
                raise DriverUnavailable(f"{what}: {one_line(exc)}") from exc

    async def ensure_schema(self, connection: Connection) -> None:
        """The tables, where missing (once per bus)."""
        if self._schema_ready:
            return
        cursor = await connection.execute(sql.SCHEMA_READY)
        if (await cursor.fetchone()) == (True,):
            self._schema_ready = True
            return
        async with connection.transaction():
            await connection.execute(f"SELECT pg_advisory_xact_lock({DDL_LOCK_KEY})")
            for statement in sql.SCHEMA:
                await connection.execute(statement)  # type: ignore[arg-type]  # constants
        self._schema_ready = True

    # -- lanes --------------------------------------------------------------------------------

    async def ensure(self, lane: Lane, *, apply_limits: bool) -> None:
        """The tables (if nobody migrated the database) and, for a group, its cursor at the
        oldest event kept. A lane has no limits stored in the database (its dead letters' age
        is read from the Lane when pruning), so `apply_limits` changes nothing."""
        async with self._using(f"cannot set up {lane_key(lane)}") as connection:
            await self.ensure_schema(connection)
            async with connection.transaction():  # racing creates of one sequence can fail
                await connection.execute(f"SELECT pg_advisory_xact_lock({DDL_LOCK_KEY})")
                counter = sql.COUNTER_CREATE.format(name=sql.counter_of(lane_key(lane)))
                await connection.execute(counter)  # type: ignore[arg-type]  # a hex name
            if lane.kind == "group":
                await connection.execute(sql.CURSOR_CREATE, {"lane": lane_key(lane)})

    async def publish(self, lane: Lane, messages: Sequence[Message]) -> list[bool]:
        if not messages:
            return []
        key = lane_key(lane)
        async with (
            self._using(f"cannot publish to {key}") as connection,
            connection.transaction(),
            connection.cursor() as cursor,
        ):
            params = [publish_params(lane, message) for message in messages]
            kept = await _each_row(cursor, sql.PUBLISH, params)
            if any(kept):
                await cursor.execute(sql.NOTIFY, {"channel": sql.WAKE_CHANNEL, "payload": key})
        return kept

    def publish_in(self, session: Session, lane: Lane, messages: Sequence[Message]) -> list[bool]:
        """Store jobs through the caller's SQLAlchemy session (on this bus's database), in its
        transaction: they exist if and only if it commits, and its commit wakes the workers
        (the NOTIFY is part of it). True each one kept, False a duplicate id."""
        from sqlalchemy import text

        if session.get_bind().dialect.name != "postgresql":
            raise ConfigError("publish_in needs a session on the bus's PostgreSQL database")
        key = lane_key(lane)
        statement = text(sql.sqlalchemy_text(sql.PUBLISH))
        kept = [
            bool(session.execute(statement, publish_params(lane, message)).scalar_one())
            for message in messages
        ]
        if any(kept):
            notify = text(sql.sqlalchemy_text(sql.NOTIFY))
            session.execute(notify, {"channel": sql.WAKE_CHANNEL, "payload": key})
        return kept

    async def stats(self, lane: Lane) -> LaneStats:
        """For a group, `pending` also counts the matching events not yet copied to it, and
        `oldest_ms` their first one's emit time. `oldest_ms` leaves out rows not due yet;
        `stored` is the lane's sequence (see sql.COUNTER_DDL: every row ever inserted for the
        lane, a publish, a requeue, an event copied to a group, rolled back or not). A lane of
        more than sql.STATS_EXACT_ROWS rows is counted by estimate (`approximate`): its
        `pending` from the planner's statistics, its `in_flight` and `oldest_ms` from the head
        of its claim index, so that reading it never scans the lane."""
        key = lane_key(lane)
        params = {"lane": key, "counter": sql.counter_of(key), "cap": sql.STATS_EXACT_ROWS + 1}
        async with self._using(f"cannot read {key}") as connection:
            (rows,) = await _one(await connection.execute(sql.LANE_ROWS, params))
            approximate = rows > sql.STATS_EXACT_ROWS
            if approximate:  # counted by estimate (sql.STATS_EXACT_ROWS)
                cursor = await connection.execute(sql.STATS_HEAD, params)
                in_flight, dead, oldest, stored = await _one(cursor)
                cursor = await connection.execute(sql.ROWS_ESTIMATE, params)
                (plan,) = await _one(cursor)
                pending = max(rows, int(plan[0]["Plan"]["Plan Rows"])) - in_flight
            else:
                cursor = await connection.execute(sql.STATS, params)
                pending, in_flight, dead, oldest, stored = await _one(cursor)
            if lane.kind == "group":
                pattern = sql.pattern_regex(lane.subject)
                cursor = await connection.execute(sql.UNCOPIED, {"lane": key, "pattern": pattern})
                uncopied, first_emitted = await _one(cursor)
                pending += uncopied
                if first_emitted is not None:
                    oldest = first_emitted if oldest is None else min(oldest, first_emitted)
        return LaneStats(
            pending=int(pending), in_flight=int(in_flight), dlq=int(dead),
            oldest_ms=None if oldest is None else int(oldest), stored=int(stored),
            approximate=approximate,
        )  # fmt: skip

    def receiver(self, lane: Lane, *, consumer: str) -> Receiver:
        receiver = PostgresReceiver(self, lane, consumer)
        self._receivers.add(receiver)
        return receiver

    # -- dead letters -------------------------------------------------------------------------

    async def dead_letters(
        self, lane: Lane, *, limit: int, before: int | None = None
    ) -> list[DlqRecord]:
        """`WHERE lane = %s AND seq < %s ORDER BY seq DESC LIMIT %s`: a range of the
        (lane, seq) index, as fast on the last page as on the first."""
        key = lane_key(lane)
        params = {"lane": key, "limit": limit, "before": 2**63 - 1 if before is None else before}
        async with self._using(f"cannot read the dead letters of {key}") as connection:
            cursor = await connection.execute(sql.DEAD_LIST, params)
            rows = await cursor.fetchall()
        records: list[DlqRecord] = []
        for seq, record in rows:
            record["seq"] = int(seq)
            records.append(record)
        return records

    async def dead_letter(self, lane: Lane, job_id: str) -> DlqRecord | None:
        """Through the index on (lane, the record's id)."""
        key = lane_key(lane)
        async with self._using(f"cannot read the dead letters of {key}") as connection:
            cursor = await connection.execute(sql.DEAD_GET, {"lane": key, "job_id": job_id})
            row = await cursor.fetchone()
        if row is None:
            return None
        seq, record = row
        record["seq"] = int(seq)
        found: DlqRecord = record
        return found

    async def delete_dead(self, lane: Lane, seq: int) -> bool:
        key = lane_key(lane)
        async with self._using(f"cannot delete a dead letter of {key}") as connection:
            cursor = await connection.execute(sql.DEAD_DELETE, {"lane": key, "seq": seq})
        return cursor.rowcount > 0

    async def count_dead(self, lane: Lane) -> int:
        key = lane_key(lane)
        async with self._using(f"cannot count the dead letters of {key}") as connection:
            cursor = await connection.execute(sql.DEAD_COUNT, {"lane": key})
            (count,) = await _one(cursor)
        return int(count)

    async def requeue(self, lane: Lane, record: DlqRecord) -> None:
        """A record listed here (with its `seq`) that is gone already (requeued or purged
        meanwhile) is not stored again; one without `seq` is stored."""
        key = lane_key(lane)
        async with (
            self._using(f"cannot requeue into {key}") as connection,
            connection.transaction(),
        ):
            if "seq" in record:
                cursor = await connection.execute(
                    sql.DEAD_TAKE, {"lane": key, "seq": record["seq"]}
                )
                if await cursor.fetchone() is None:
                    return
            await connection.execute(
                sql.REQUEUE,
                {
                    "lane": key,
                    "job_id": record["id"],
                    "subject": record["subject"],
                    "body": job_body(record),
                    "enqueued_at_ms": record.get("first_enqueued_at") or int(time.time() * 1000),
                    "flow_key": stored_key(lane, record.get("flow_key")),
                    # A prioritized lane's claim reads its rows by band: a dead letter keeps
                    # no band, and comes back in the normal one.
                    "priority": "normal" if lane.prioritized else None,
                },
            )
            await connection.execute(sql.NOTIFY, {"channel": sql.WAKE_CHANNEL, "payload": key})

    async def purge(self, lane: Lane) -> int:
        key = lane_key(lane)
        async with self._using(f"cannot purge the dead letters of {key}") as connection:
            cursor = await connection.execute(sql.DEAD_PURGE, {"lane": key})
        return max(cursor.rowcount, 0)

    # -- records ------------------------------------------------------------------------------

    async def put_records(
        self, lane: Lane, table: Table, records: Sequence[tuple[str, bytes]], *, create: bool,
        confirm: bool = True,
    ) -> list[bool]:  # fmt: skip
        """One statement for the batch, on the database's clock; a table kept 0 s is never
        written (nothing will be read). As if written one by one, in order: an overwrite of a
        key twice leaves its last record, a create of a key twice stores its first."""
        keep_s = float(lane.keep_s(table))
        if not records or keep_s <= 0:
            return [True] * len(records)
        key = lane_key(lane)
        # Each key once (a row changes at most once per statement): the record that would last.
        kept = dict(reversed(records)) if create else dict(records)
        params = {
            "lane": key, "tbl": table, "keep_s": keep_s,
            "keys": list(kept), "values": list(kept.values()),
        }  # fmt: skip
        async with self._using(f"cannot store the {table} records of {key}") as connection:
            cursor = await connection.execute(
                sql.RECORDS_CREATE if create else sql.RECORDS_PUT, params
            )
            if not create:
                return [True] * len(records)
            stored = {row[0] for row in await cursor.fetchall()}
        first: dict[str, int] = {}  # each key's first record, the one a create stores
        for n, (record_key, _) in enumerate(records):
            first.setdefault(record_key, n)
        return [
            record_key in stored and first[record_key] == n
            for n, (record_key, _) in enumerate(records)
        ]

    async def get_records(
        self, lane: Lane, table: Table, keys: Sequence[str]
    ) -> list[bytes | None]:
        if not keys:
            return []
        lane_id = lane_key(lane)
        async with self._using(f"cannot read the {table} records of {lane_id}") as connection:
            cursor = await connection.execute(
                sql.RECORDS_GET, {"lane": lane_id, "tbl": table, "keys": list(keys)}
            )
            found = {key: bytes(value) for key, value in await cursor.fetchall()}
        return [found.get(key) for key in keys]

    async def list_records(self, lane: Lane, table: Table) -> list[tuple[str, bytes]]:
        """`WHERE lane AND tbl`: a range of the records' primary key."""
        lane_id = lane_key(lane)
        async with self._using(f"cannot list the {table} records of {lane_id}") as connection:
            cursor = await connection.execute(sql.RECORDS_LIST, {"lane": lane_id, "tbl": table})
            return [(key, bytes(value)) for key, value in await cursor.fetchall()]

    # -- events -------------------------------------------------------------------------------

    async def ensure_events(self, *, max_age_s: float) -> None:
        """The tables, where missing; events older than `max_age_s` are pruned by the groups'
        receivers (0: kept forever)."""
        self.events_max_age_s = max_age_s
        async with self._using("cannot set up the events log") as connection:
            await self.ensure_schema(connection)

    async def emit(self, messages: Sequence[Message], *, max_age_s: float) -> list[bool]:
        """Appended under the emit lock (see sql.EMIT_LOCK), so that seq order is commit
        order: emits of all processes queue there for the length of one short transaction."""
        if not messages:
            return []
        self.events_max_age_s = max_age_s
        params = [
            {
                "event_id": message.id,
                "name": message.subject,
                "body": message.body,
                "emitted_at_ms": message.enqueued_at_ms,
                "trace": sql.trace_text(message.trace),
            }
            for message in messages
        ]
        async with (
            self._using("cannot emit") as connection,
            connection.transaction(),
            connection.cursor() as cursor,
        ):
            await cursor.execute(sql.EMIT_LOCK)
            kept = await _each_row(cursor, sql.EMIT, params)
            if any(kept):
                await cursor.execute(
                    sql.NOTIFY, {"channel": sql.WAKE_CHANNEL, "payload": sql.EVENTS_PAYLOAD}
                )
        return kept

    async def watch_commits(self, wake: Callable[[], None]) -> Callable[[], Awaitable[None]]:
        """`wake()` at each NOTIFY on mega_outbox_wake (heard by the bus's LISTEN connection)."""
        self._commit_watchers.add(wake)

        async def stop() -> None:
            self._commit_watchers.discard(wake)

        return stop

    def announce_commit(self) -> None:
        async def notify() -> None:
            with contextlib.suppress(DriverUnavailable):
                async with self._using("announce") as connection:
                    await connection.execute(
                        sql.NOTIFY, {"channel": sql.OUTBOX_CHANNEL, "payload": ""}
                    )

        task = asyncio.create_task(notify())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- wake-ups -----------------------------------------------------------------------------

    def subscribe(self, payloads: Sequence[str], event: asyncio.Event) -> None:
        """Set `event` at each NOTIFY on the lanes' channel with one of `payloads`."""
        for payload in payloads:
            self._wakers.setdefault(payload, set()).add(event)

    def unsubscribe(self, payloads: Sequence[str], event: asyncio.Event) -> None:
        for payload in payloads:
            self._wakers.get(payload, set()).discard(event)

    def forget(self, receiver: PostgresReceiver) -> None:
        self._receivers.discard(receiver)

    async def _listen_forever(self, connection: Connection | None) -> None:
        """Hear the NOTIFYs of the lanes and of the outbox; reconnect when the server goes (the
        receivers poll meanwhile, and are all woken once back, for what they missed)."""
        warned = ""
        while True:
            try:
                if connection is None:
                    connection = await open_connection(self.url)
                await connection.execute(f"LISTEN {sql.WAKE_CHANNEL}")
                await connection.execute(f"LISTEN {sql.OUTBOX_CHANNEL}")
                if warned:
                    logger.info("%s: listening again", self.alias)
                    warned = ""
                    self._wake_everyone()
                async for note in connection.notifies():
                    if note.channel == sql.OUTBOX_CHANNEL:
                        for wake in list(self._commit_watchers):
                            wake()
                    else:
                        for event in self._wakers.get(note.payload, ()):
                            event.set()
            except (psycopg.Error, OSError, TimeoutError) as exc:
                if one_line(exc) != warned:
                    warned = one_line(exc)
                    logger.warning("%s: LISTEN lost (%s); polling meanwhile", self.alias, warned)
                if connection is not None:
                    with contextlib.suppress(Exception):
                        await connection.close()
                connection = None
                await asyncio.sleep(LISTEN_RETRY_S)
            finally:
                if self._closed and connection is not None:
                    with contextlib.suppress(Exception):
                        await connection.close()

    def _wake_everyone(self) -> None:
        for events in self._wakers.values():
            for event in events:
                event.set()
        for wake in list(self._commit_watchers):
            wake()


async def _each_row(
    cursor: psycopg.AsyncCursor[tuple[Any, ...]], statement: str, params: list[dict[str, Any]]
) -> list[bool]:
    """Run `statement` once per params (pipelined: one round trip), each answering one row or
    none; True each time a row came back and it was not false."""
    await cursor.executemany(statement, params, returning=True)  # type: ignore[arg-type]
    found: list[bool] = []
    while True:
        row = await cursor.fetchone()
        found.append(row is not None and row[0] is not False)
        if not cursor.nextset():
            return found


async def _one(cursor: psycopg.AsyncCursor[tuple[Any, ...]]) -> tuple[Any, ...]:
    row = await cursor.fetchone()
    assert row is not None  # an aggregate always answers one row
    return row
